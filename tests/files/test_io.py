"""Atomic writes, made observable: a write of a run file that fails midway — the serialiser dies after
writing part of the bytes, or the final rename fails — leaves the old file intact (or no file), no
partial file and no temporary file, and the run can go on afterwards.

A file written straight to its destination fails these tests in one of two ways: the partial
bytes are left in the destination, or a failing rename is never reached (so nothing raises).
"""

from __future__ import annotations

import io
import json
import os
import pathlib
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import gradscope
from tests.helpers.runs import small_run
from gradscope.train import train
from gradscope.files.io import atomic_save, atomic_write_text


class Injected(OSError):
    """The failure these tests inject (disk full, say)."""


def _fail_serialising(monkeypatch: pytest.MonkeyPatch, hit: Callable[[str], bool]) -> None:
    """torch.save and Path.write_text write the first half of their bytes to a matching target, then raise."""
    real_save, real_write_text = torch.save, pathlib.Path.write_text

    def half(target: Any, data: bytes) -> None:
        if isinstance(target, (str, os.PathLike)):
            with open(target, "wb") as fh:
                fh.write(data[: len(data) // 2])
        else:
            target.write(data[: len(data) // 2])
        raise Injected(f"injected: died while writing {target}")

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if not hit(str(getattr(f, "name", f))):
            return real_save(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        half(f, buffer.getvalue())

    def write_text(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        if not hit(str(self)):
            return real_write_text(self, data, *args, **kwargs)
        half(self, data.encode())
        return 0

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(pathlib.Path, "write_text", write_text)


def _fail_renaming(monkeypatch: pytest.MonkeyPatch, hit: Callable[[str], bool]) -> None:
    """os.replace / os.rename onto a matching destination raise."""
    for name in ("replace", "rename"):
        real = getattr(os, name)

        def fail(src: Any, dst: Any, *args: Any, _real: Callable = real, **kwargs: Any) -> None:
            if hit(os.fspath(dst)):
                raise Injected(f"injected: cannot rename onto {dst}")
            return _real(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, name, fail)


FAILURES = {"serialiser dies midway": _fail_serialising, "rename fails": _fail_renaming}


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir())}


def _temporaries(run: Path) -> list[str]:
    return [p.name for p in run.iterdir() if p.name.startswith(".") or p.name.endswith((".tmp", ".part"))]


def _params(run: Path) -> dict[str, torch.Tensor]:
    return gradscope.load(run).model.state_dict()


def _log(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("atomic") / "whole"
    train(small_run(iterations=10), run)
    return run


@pytest.mark.parametrize("failure", list(FAILURES))
def test_failed_checkpoint_write_keeps_the_earlier_checkpoint_and_leaves_no_partial_file(
        failure: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uninterrupted: Path) -> None:
    cfg, run = small_run(iterations=10), tmp_path / "run"  # checkpoints every 5 iterations
    train(cfg, run, stop_after=5)
    before = _files(run)
    assert "step-0000005.pt" in before
    FAILURES[failure](monkeypatch, lambda path: "step-0000010.pt" in path)
    with pytest.raises(Injected):
        train(cfg, run, resume=True)
    monkeypatch.undo()
    after = _files(run)
    assert _temporaries(run) == [], "a temporary file was left behind"
    assert sorted(after) == sorted(before), "a partial checkpoint was left in place"
    assert after["step-0000005.pt"] == before["step-0000005.pt"] and after["config.json"] == before["config.json"]
    assert gradscope.load(run).iteration == 5
    # the run goes on from the intact checkpoint and ends where an uninterrupted run ends
    train(cfg, run, resume=True)
    a, b = _params(run), _params(uninterrupted)
    # bit for bit: the same machine, thread count and code path
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _log(run) == _log(uninterrupted)
    assert json.loads((run / "eval.json").read_text()) == json.loads((uninterrupted / "eval.json").read_text())


@pytest.mark.parametrize("failure", list(FAILURES))
def test_failed_config_write_leaves_no_config(failure: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose config.json could not be written is not a run: no (partial) config.json, and the
    same directory can be started again."""
    cfg, run = small_run(iterations=10), tmp_path / "run"
    FAILURES[failure](monkeypatch, lambda path: "config.json" in path)
    with pytest.raises(Injected):
        train(cfg, run)
    monkeypatch.undo()
    left = sorted(p.name for p in run.iterdir()) if run.exists() else []
    assert left == [], f"left behind: {left}"
    train(cfg, run)
    assert gradscope.load(run).iteration == 10


@pytest.mark.parametrize("failure", list(FAILURES))
def test_failed_eval_write_leaves_no_partial_eval(failure: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  uninterrupted: Path) -> None:
    cfg, run = small_run(iterations=10), tmp_path / "run"
    train(cfg, run, stop_after=5)
    FAILURES[failure](monkeypatch, lambda path: "eval.json" in path)
    with pytest.raises(Injected):
        train(cfg, run, resume=True)  # trains to the end, then fails writing eval.json
    monkeypatch.undo()
    assert not (run / "eval.json").exists(), "a partial eval.json was left in place"
    assert _temporaries(run) == [], "a temporary file was left behind"
    assert gradscope.load(run).iteration == 10
    train(cfg, run, resume=True)  # nothing left to train: evaluates and writes eval.json
    assert json.loads((run / "eval.json").read_text()) == json.loads((uninterrupted / "eval.json").read_text())


@pytest.mark.parametrize("failure", list(FAILURES))
def test_failed_metrics_rewrite_on_resume_keeps_the_old_log(failure: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            uninterrupted: Path) -> None:
    """On resume the log is cut back to the last checkpoint and rewritten; if that fails, the old
    log is intact, and the next resume cuts it right."""
    cfg, run = small_run(iterations=10), tmp_path / "run"  # logs every 5 iterations
    train(cfg, run, stop_after=5)
    with open(run / "metrics.jsonl", "a") as log:  # work after the checkpoint, then a kill mid-line
        log.write('{"iteration": 6, "loss": 9.0, "accuracy": 0.0, "lr": 0.0, "tokens_per_s": 1.0}\n{"iteration": 7, "lo')
    old = (run / "metrics.jsonl").read_bytes()
    FAILURES[failure](monkeypatch, lambda path: "metrics.jsonl" in path)
    with pytest.raises(Injected):
        train(cfg, run, resume=True)
    monkeypatch.undo()
    assert (run / "metrics.jsonl").read_bytes() == old, "the old log was changed"
    assert _temporaries(run) == [], "a temporary file was left behind"
    train(cfg, run, resume=True)
    assert _log(run) == _log(uninterrupted)  # the lines past the checkpoint were dropped, not kept


@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("kind", ["text", "torch"])
def test_the_atomic_writers_keep_the_old_file(kind: str, failure: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Overwriting an existing file (what a re-written eval.json, config.json or checkpoint would be)."""
    path = tmp_path / ("eval.json" if kind == "text" else "step-0000005.pt")
    write = (lambda value: atomic_write_text(path, json.dumps({"value": value}))) if kind == "text" else \
        (lambda value: atomic_save({"value": torch.full((1000,), float(value))}, path))
    write(1)
    old = path.read_bytes()
    FAILURES[failure](monkeypatch, lambda p: path.name in p)
    with pytest.raises(Injected):
        write(2)
    monkeypatch.undo()
    assert path.read_bytes() == old, "the old file was changed"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name], "a temporary file was left behind"
    write(3)
    assert path.read_bytes() != old
