"""The per-point runner lock: exclusive, heartbeat, stale locks taken over, live ones refused."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradscope.errors import GradscopeError
from gradscope.workflows.lock import is_stale, point_lock


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
    from gradscope.workflows.sweep import lock_path, parse_spec, plan_points, run_point
    spec = parse_spec('[settings]\niterations = 4\nhidden_size = 8\nembed_size = 4\n[axes]\nseed = [1]\n')
    point, layout = plan_points(spec)[0], Layout(tmp_path)
    with point_lock(lock_path(point, layout), "held"):
        with pytest.raises(GradscopeError, match=f"point {point.name}: already being run"):
            run_point(point, str(tmp_path), spec.analyses, threads=1)
    assert not layout.run(point.run).exists()  # nothing was started
    assert dict(run_point(point, str(tmp_path), spec.analyses, threads=1).steps) == {"train": "trained"}
