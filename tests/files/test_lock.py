"""One writer per run directory (``files.lock``): a directory held by a trainer, in this process or in
another, is refused in one line and changed in nothing; a killed trainer's lock is stale, and the next run
takes it over. The stopped run comes from tests/files/conftest.py.
"""

from __future__ import annotations

import json
import socket
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradscope.errors import GradscopeError
from gradscope.files.lock import is_stale, point_lock
from tests.helpers.fuzzkit import assert_clean, invoke, leftovers
from tests.helpers.hardening import copy_run, raw
from tests.helpers.hardening import refused_untouched as refused


def test_a_run_directory_being_trained_is_refused(stopped: Path, tmp_path: Path) -> None:
    from gradscope.files.lock import run_lock
    run = copy_run(stopped, tmp_path / "run")
    with run_lock(run):
        err = refused(["train", "--resume", run, "-q"], tmp_path, "resume while held")
        assert "already being run" in err
        shutil.rmtree(tmp_path / "fresh", ignore_errors=True)
        with run_lock(tmp_path / "fresh"):
            err = refused(["train", "-o", tmp_path / "fresh", "-q", "--iterations", "2"], tmp_path, "fresh while held")
            assert "already being run" in err
    assert invoke(["train", "--resume", run, "-q"]).rc == 0  # released afterwards


def test_a_second_trainer_is_refused_while_another_process_trains_and_a_killed_ones_lock_is_taken_over(
        tmp_path: Path) -> None:
    """A real trainer in another process holds the directory: ``train -o`` and ``train --resume``
    of it are refused in one line and change nothing. Once it is killed (-9), its lock is stale and
    the next run takes it over."""
    from gradscope.files.lock import run_lock_path
    run = tmp_path / "r"
    cmd = [sys.executable, "-c", "from gradscope.cli.app import main; main()", "train", "-o", str(run),
           "--vocab-size", "8", "--length", "4", "--hidden-size", "16", "--embed-size", "8", "--iterations", "1000000",
           "--checkpoint-every", "20", "--batch-size", "16", "--heldout-size", "64", "--grid-per-cell", "2", "-q",
           "--threads", "1"]
    other = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not list(run.glob("step-*.pt")):
            assert other.poll() is None, other.stderr.read() if other.stderr else ""
            assert time.time() < deadline, "no checkpoint within 120 s"
            time.sleep(0.05)
        assert json.loads(run_lock_path(run).read_text())["pid"] == other.pid
        for args in (["train", "-o", run, "-q", "--iterations", "5"], ["train", "--resume", run, "-q"]):
            outcome = invoke(args)
            assert_clean(outcome)
            assert outcome.rc == 2 and "already being run" in outcome.err, outcome.err
    finally:
        other.kill()
        other.wait()
    assert run_lock_path(run).exists()  # left by the killed trainer
    reached = max(int(p.name[5:12]) for p in run.glob("step-*.pt"))
    outcome = invoke(["train", "--resume", run, "-q", "--stop-after", "1"])
    assert outcome.rc == 0, outcome.err
    assert raw(run / f"step-{reached + 1:07d}.pt")["iteration"] == reached + 1
    assert not run_lock_path(run).exists() and not leftovers(run)


# ---- the per-point runner lock: exclusive, heartbeat, stale locks taken over, live ones refused ----------

def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_live_holder_is_refused_and_the_lock_is_released_after(tmp_path: Path) -> None:
    lock = tmp_path / ".p.lock"
    with point_lock(lock, "point p"):
        holder = json.loads(lock.read_text())
        assert holder["host"] == socket.gethostname() and holder["pid"] == os.getpid()
        with pytest.raises(GradscopeError, match=rf"point p: already being run by {socket.gethostname()}:{os.getpid()}"):
            with point_lock(lock, "point p"):
                pass
    assert not lock.exists()


def test_the_heartbeat_keeps_a_long_holder_fresh(tmp_path: Path) -> None:
    lock = tmp_path / ".p.lock"
    with point_lock(lock, "p", stale_after=0.5, beat=0.05):
        old = time.time() - 10
        os.utime(lock, (old, old))
        time.sleep(0.3)
        assert time.time() - lock.stat().st_mtime < 0.3 and not is_stale(lock, stale_after=0.5)


def test_stale_locks_are_taken_over(tmp_path: Path) -> None:
    lock = tmp_path / ".p.lock"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid()}))  # a killed worker here
    assert is_stale(lock)
    with point_lock(lock, "p"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    lock.write_text(json.dumps({"host": "elsewhere", "pid": 1}))  # another host: judged by heartbeat age
    assert not is_stale(lock, stale_after=60)
    with pytest.raises(GradscopeError, match="elsewhere:1"):
        with point_lock(lock, "p", stale_after=60):
            pass
    old = time.time() - 61
    os.utime(lock, (old, old))
    with point_lock(lock, "p", stale_after=60):
        pass
    assert not lock.exists()


def test_a_lock_taken_over_meanwhile_is_left_to_its_new_holder(tmp_path: Path) -> None:
    lock = tmp_path / ".p.lock"
    with point_lock(lock, "p"):
        lock.write_text(json.dumps({"host": "elsewhere", "pid": 7}))
    assert json.loads(lock.read_text())["host"] == "elsewhere"


def test_run_point_refuses_a_point_that_is_already_running(tmp_path: Path) -> None:
    from gradscope.workflows.study.reproduce import Layout
    from gradscope.workflows.sweep.grid import lock_path, parse_spec, plan_points, run_point
    spec = parse_spec('[settings]\niterations = 4\nhidden_size = 8\nembed_size = 4\n[axes]\nseed = [1]\n')
    point, layout = plan_points(spec)[0], Layout(tmp_path)
    with point_lock(lock_path(point, layout), "held"):
        with pytest.raises(GradscopeError, match=f"point {point.name}: already being run"):
            run_point(point, str(tmp_path), spec.analyses, threads=1)
    assert not layout.run(point.run).exists()  # nothing was started
    assert dict(run_point(point, str(tmp_path), spec.analyses, threads=1).steps) == {"train": "trained"}
