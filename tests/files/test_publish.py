"""Publishing a file or a store (``files.publish``): a dead writer's temporaries are removed by the next run
(a live writer's are kept), and ``--overwrite`` of a link to a directory replaces the link, never its
target. The stopped run comes from tests/files/conftest.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.fuzzkit import invoke, leftovers
from tests.helpers.hardening import FAST, copy_run, input_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small trained checkpoints: "first" (the default core), "other" and a factory's "lm"."""
    return input_runs(tmp_path_factory)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_writers_temporaries_are_removed_by_the_next_run(stopped: Path, tmp_path: Path) -> None:
    from gradscope.files.publish import _HOST
    run = copy_run(stopped, tmp_path / "run")
    pid = dead_pid()
    for name in ("step-0000015.pt", "metrics.jsonl", "eval.json"):
        (run / f".{name}.{_HOST}-{pid}-0123abcd.tmp").write_bytes(b"half a file")
    live = run / f".step-0000020.pt.{_HOST}-{os.getpid()}-0123abcd.tmp"  # a live writer's: kept
    live.write_bytes(b"being written")
    assert invoke(["train", "--resume", run, "-q"]).rc == 0
    assert sorted(p.name for p in run.glob(".*.tmp")) == [live.name]
    live.unlink()


def test_a_killed_runs_temporaries_are_removed_by_the_rerun(runs: dict[str, Path], tmp_path: Path) -> None:
    from gradscope.files.publish import temp_path
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = temp_path(tmp_path / "k.zarr")
    stale = stale.with_name(stale.name.replace(f"-{os.getpid()}-", f"-{dead.pid}-"))
    (stale / "c").mkdir(parents=True)  # what a `stability -o k.zarr` killed while writing leaves
    ours = temp_path(tmp_path / "k.zarr")  # a live writer's (this process) must be kept
    ours.mkdir()
    outcome = invoke(["stability", runs["first"], "-o", tmp_path / "k.zarr", "--triplets", "1", *FAST])
    assert outcome.rc == 0, outcome.err
    assert not stale.exists() and ours.exists()
    ours.rmdir()
    assert not leftovers(tmp_path)


def test_overwrite_replaces_a_symlink_to_a_directory_not_its_target(tmp_path: Path) -> None:
    """`-o LINK --overwrite` where LINK points to a directory once ended in a NotADirectoryError
    traceback from the publish step (issue #24): the link is replaced, its target is left as it was."""
    import xarray as xr
    from gradscope.store.io import write_store
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("user data")
    link = tmp_path / "out.zarr"
    link.symlink_to(target, target_is_directory=True)
    ds = xr.Dataset({"x": ("i", np.arange(3.0))}, attrs={"kind": "test"})
    write_store(ds, link, overwrite=True)
    assert not link.is_symlink() and link.is_dir() and (link / "zarr.json").is_file()
    assert (target / "keep.txt").read_text() == "user data" and sorted(p.name for p in target.iterdir()) == ["keep.txt"]
