"""One writer per run directory (``files.lock``): a directory held by a trainer, in this process or in
another, is refused in one line and changed in nothing; a killed trainer's lock is stale, and the next run
takes it over. The stopped run comes from tests/files/conftest.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

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
