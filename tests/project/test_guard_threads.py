"""gradscope.guard.use_free_cores: an analysis uses the cores no other runnable process wants (a fake /proc/stat)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradscope import guard as threads


def _stat(tmp_path: Path, running: int) -> Path:
    path = tmp_path / "stat"
    path.write_text(f"cpu  1 2 3 4\nctxt 5\nprocs_running {running}\nprocs_blocked 0\n")
    return path


def _own(folder: Path, states: str) -> Path:
    """A fake /proc/self/task: one thread per letter of ``states`` (R running, S sleeping)."""
    for tid, state in enumerate(states, start=100):
        (folder / str(tid)).mkdir(parents=True)
        (folder / str(tid) / "stat").write_text(f"{tid} (python) {state} 1 2 3\n")
    return folder


@pytest.fixture(autouse=True)
def one_own_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as the fake /proc/stat readings assume it: one running thread (the reader)."""
    monkeypatch.setattr(threads, "OWN_TASKS", _own(tmp_path / "self-task", "RS"))


@pytest.mark.parametrize(("running", "cores", "expected"), [(1, 2, 2), (2, 2, 1), (3, 2, 1), (9, 16, 8), (1, 1, 1)])
def test_free_cores_leave_the_busy_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running: int, cores: int,
                                        expected: int) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    monkeypatch.setattr(threads, "INTERVAL", 0.0)
    assert threads.free_cores(_stat(tmp_path, running)) == expected  # this process's reading thread is one


@pytest.mark.parametrize(("readings", "others"), [([1, 3, 1, 3, 1], 2), ([1, 3, 1, 1, 1], 0), ([4, 3, 2, 1, 1], 2)])
def test_what_two_readings_show_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readings: list[int],
                                       others: int) -> None:
    """A busy process is runnable in nearly every reading; one that shows in a single reading (a kernel worker
    that woke) is no load."""
    path = _stat(tmp_path, 1)
    sequence = iter(readings)
    original = Path.read_text

    def read(self: Path, *args: object, **kwargs: object) -> str:
        return f"procs_running {next(sequence)}\n" if self == path else original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read)
    monkeypatch.setattr(threads, "INTERVAL", 0.0)
    assert threads.runnable_others(path) == others


def test_this_processs_own_running_threads_are_not_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's OpenMP workers spin after an operation and the run queue counts them: they are this process's, not
    load (an idle machine read as busy would run on fewer cores and never cache its rates)."""
    monkeypatch.setattr(threads, "INTERVAL", 0.0)
    own = _own(tmp_path / "three", "RRSR")
    assert threads.own_running(own) == 3
    assert threads.runnable_others(_stat(tmp_path, 4), tasks=own) == 1
    assert threads.runnable_others(_stat(tmp_path, 3), tasks=own) == 0
    assert threads.own_running(_own(tmp_path / "asleep", "S")) == 1  # the reader itself runs
    assert threads.own_running(tmp_path / "none") == 1


def test_environment_and_unknown_machines_leave_torch_alone(tmp_path: Path) -> None:
    assert threads.choose_threads(_stat(tmp_path, 5), env={"OMP_NUM_THREADS": "4"}) is None
    assert threads.choose_threads(_stat(tmp_path, 5), env={"MKL_NUM_THREADS": "2"}) is None
    assert threads.choose_threads(tmp_path / "no-such-stat", env={}) is None
    assert threads.runnable_others(tmp_path / "no-such-stat") is None


def _task(proc: Path, pid: int, tid: int, state: str, nice: int, comm: str = "python") -> None:
    """A /proc/<pid>/task/<tid>/stat line: pid (comm) state, then fields 4 … 19 (nice the 19th)."""
    folder = proc / str(pid) / "task" / str(tid)
    folder.mkdir(parents=True)
    rest = ["0"] * 15 + [str(nice)] + ["0"] * 30
    (folder / "stat").write_text(f"{tid} ({comm}) {state} " + " ".join(rest) + "\n")


def test_the_run_queue_slows_a_run_by_the_others_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two busy processes at nice 0 on two cores leave one thread 2/3 of a core (1.5× slow); nice-19 work (weight
    15 of 1024), sleeping tasks and this process's own threads count (almost) nothing; no /proc: None."""
    import os

    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "INTERVAL", 0.0)
    proc = tmp_path / "proc"
    _task(proc, os.getpid(), os.getpid(), "R", 0)  # this process: never counted
    _task(proc, 101, 101, "S", 0)  # sleeping
    assert threads.queue_slowdown(1, proc) == 1.0
    _task(proc, 102, 102, "R", 0, comm="a (b) c")  # a name with spaces and parentheses
    _task(proc, 103, 104, "R", 0)
    assert threads.queue_slowdown(1, proc) == pytest.approx(1.5)
    _task(proc, 105, 105, "R", 19)
    assert threads.queue_slowdown(1, proc) == pytest.approx(1.5 + 1 / 1.25 ** 19 / 2)
    assert threads.queue_slowdown(1, tmp_path / "no-proc") is None
