"""gradscope.guard.use_free_cores: an analysis uses the cores no other runnable process wants (a fake /proc/stat)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradscope import guard as threads


def _stat(tmp_path: Path, running: int) -> Path:
    path = tmp_path / "stat"
    path.write_text(f"cpu  1 2 3 4\nctxt 5\nprocs_running {running}\nprocs_blocked 0\n")
    return path


@pytest.mark.parametrize(("running", "cores", "expected"), [(1, 2, 2), (2, 2, 1), (3, 2, 1), (9, 16, 8), (1, 1, 1)])
def test_free_cores_leave_the_busy_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running: int, cores: int,
                                        expected: int) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    monkeypatch.setattr(threads, "INTERVAL", 0.0)
    assert threads.free_cores(_stat(tmp_path, running)) == expected  # this process's reading thread is one


def test_the_busiest_reading_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _stat(tmp_path, 1)
    readings = iter([1, 3, 1, 1, 1])
    original = Path.read_text

    def read(self: Path, *args: object, **kwargs: object) -> str:
        return f"procs_running {next(readings)}\n" if self == path else original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read)
    monkeypatch.setattr(threads, "INTERVAL", 0.0)
    assert threads.runnable_others(path) == 2


def test_environment_and_unknown_machines_leave_torch_alone(tmp_path: Path) -> None:
    assert threads.choose_threads(_stat(tmp_path, 5), env={"OMP_NUM_THREADS": "4"}) is None
    assert threads.choose_threads(_stat(tmp_path, 5), env={"MKL_NUM_THREADS": "2"}) is None
    assert threads.choose_threads(tmp_path / "no-such-stat", env={}) is None
    assert threads.runnable_others(tmp_path / "no-such-stat") is None
