"""Sweeps on real dask clusters: a local one, separate scheduler and worker processes, failed points
listed with their error, and a killed worker that loses only the work since its last checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest
from typer.testing import CliRunner

from gradscope.cli.app import app
from gradscope.store import read_store
from gradscope.store.manifest import read_manifest
from gradscope.files.checkpoint import list_checkpoints

from tests.helpers.runs import logged_iteration
from tests.workflows.sweep.test_grid import CLI, check_outputs, grid, sweep


# One real local sweep (`--workers 2`: the CLI starts its own LocalCluster); every other multi-process
# test shares one cluster started as users start a separate one (`dask scheduler`, `dask worker`), so
# worker processes start and import torch once, not once per test. The fault test kills one of its
# workers, so it runs last.


def test_two_worker_local_cluster_runs_the_grid_then_summarize_reads_it(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = sweep(str(grid(tmp_path)), "--out", str(out), "--workers", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "on 2 worker(s) (local cluster)" in result.stdout and "4 point(s) done now" in result.stdout
    points = check_outputs(out, ["gru-none-K8-s1", "gru-none-K8-s2", "gru-sinusoidal-K8-s1", "gru-sinusoidal-K8-s2"])
    assert len({p["worker"] for p in points.values()}) == 2  # both workers ran points
    assert {p["threads"] for p in points.values()} == {max(1, len(os.sched_getaffinity(0)) // 2)}
    # summarize reads the sweep directory directly: seeds are the trials
    summary = runner.invoke(app, ["summarize", str(out), "--kind", "accuracy", "--by", "model,pe", "-o",
                                  str(tmp_path / "summary.zarr")])
    assert summary.exit_code == 0, summary.stderr
    ds = read_store(tmp_path / "summary.zarr", kind="summary")
    assert ds["n"].sel(metric="token_accuracy").values.tolist() == [2, 2]
    assert sorted(ds["seed"].values.ravel().tolist()) == [1, 1, 2, 2]
    # a re-run skips every finished point and rewrites nothing (no cluster is started for it)
    stamps = {p: p.stat().st_mtime_ns for p in (out / "stores").iterdir()}
    again = runner.invoke(app, ["sweep", str(grid(tmp_path)), "--out", str(out), "--workers", "2"],
                          env={"COLUMNS": "200"})
    assert again.exit_code == 0 and "0 point(s) done now, 4 done earlier" in again.stdout, again.stdout
    assert {p: p.stat().st_mtime_ns for p in (out / "stores").iterdir()} == stamps


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A dask scheduler and a `dask worker` process running 3 worker processes × 1 thread (a spare one
    for the fault test), each offering the resource GPU=1, started with the console scripts users
    run. Yields its address."""
    base = tmp_path_factory.mktemp("cluster")
    dask = [str(Path(sys.executable).parent / "dask")]
    scheduler_file = base / "scheduler.json"
    procs = [subprocess.Popen([*dask, "scheduler", "--scheduler-file", str(scheduler_file), "--port", "0",
                               "--dashboard-address", ":0"], cwd=base, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.2)
        time.sleep(0.5)
        address = json.loads(scheduler_file.read_text())["address"]
        procs.append(subprocess.Popen([*dask, "worker", address, "--nthreads", "1", "--nworkers", "3",
                                       "--resources", "GPU=1"], cwd=base, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        from distributed import Client
        with Client(address, timeout="30s") as client:
            client.wait_for_workers(3, timeout=120)
            client.run(exec, "import gradscope.workflows.sweep.grid")  # all ready: the fault test needs them in step
        yield {"address": address}
    finally:
        for p in reversed(procs):  # workers first: a scheduler that goes first keeps them waiting for it
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_separate_scheduler_and_worker_processes(shared_cluster: dict[str, Any], runner: CliRunner,
                                                tmp_path: Path) -> None:
    # an unreachable scheduler is refused after the client's connect timeout (10 s of waiting): run it
    # beside the rest of the test
    unreachable = subprocess.Popen([*CLI, "sweep", str(grid(tmp_path, seeds="[1]")), "--out", str(tmp_path / "o2"),
                                    "--scheduler", "tcp://127.0.0.1:9"], cwd=tmp_path, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
    try:
        address = shared_cluster["address"]
        out = tmp_path / "out"
        missing = runner.invoke(app, ["sweep", str(grid(tmp_path, seeds="[1]")), "--out", str(out), "--scheduler",
                                      address, "--resources", "MEM=1"])
        assert missing.exit_code == 2 and "no worker of" in missing.stderr and "MEM=1" in missing.stderr
        result = sweep(str(grid(tmp_path, seeds="[1]")), "--out", str(out), "--scheduler", address, "--resources",
                       "GPU=1", cwd=tmp_path)
        assert result.returncode == 0, result.stderr + result.stdout
        assert f"scheduler {address}" in result.stdout and "dashboard: http" in result.stdout
        check_outputs(out, ["gru-none-K8-s1", "gru-sinusoidal-K8-s1"])
        report = runner.invoke(app, ["report", str(out), "-o", str(tmp_path / "r.html")])
        assert report.exit_code == 0 and "stability" in report.stdout, report.stderr
        _, stderr = unreachable.communicate(timeout=120)
    finally:
        if unreachable.poll() is None:
            unreachable.kill()
            unreachable.wait()
    assert unreachable.returncode == 2 and "cannot reach a dask scheduler" in stderr


def test_failed_points_are_listed_with_their_error_and_the_exit_status_says_so(shared_cluster: dict[str, Any],
                                                                                runner: CliRunner,
                                                                                tmp_path: Path) -> None:
    spec, out = grid(tmp_path, seeds="[1]"), tmp_path / "out"
    blocked = out / "runs" / "gru-sinusoidal-K8-s1"
    blocked.mkdir(parents=True)
    (blocked / "notes.txt").write_text("not a run")  # a directory the run must not overwrite
    result = sweep(str(spec), "--out", str(out), "--scheduler", shared_cluster["address"], cwd=tmp_path)
    assert result.returncode == 1, result.stderr + result.stdout
    assert "1 point(s) failed" in result.stdout and "gru-sinusoidal-K8-s1" in result.stdout
    assert "already exists and is not empty" in result.stdout and "1 point(s) done now" in result.stdout
    points = {p["name"]: p for p in read_manifest(out)["points"]}
    assert points["gru-none-K8-s1"]["status"] == "done" and points["gru-sinusoidal-K8-s1"]["status"] == "failed"
    assert "already exists" in points["gru-sinusoidal-K8-s1"]["error"]
    assert (blocked / "notes.txt").read_text() == "not a run"  # nothing of the user's was touched
    (blocked / "notes.txt").unlink()
    again = runner.invoke(app, ["sweep", str(spec), "--out", str(out), "--scheduler", shared_cluster["address"],
                                "-q"])
    assert again.exit_code == 0 and "1 point(s) done now, 1 done earlier" in again.stdout, again.stdout
    check_outputs(out, ["gru-none-K8-s1", "gru-sinusoidal-K8-s1"])


def test_a_killed_worker_loses_only_work_since_the_last_checkpoint(shared_cluster: dict[str, Any],
                                                                    runner: CliRunner, tmp_path: Path) -> None:
    """SIGKILL the worker process training one point (its nanny starts a new one); dask reruns the
    task on the idle third worker, which resumes from the last checkpoint. Runs last in this module."""
    from distributed import Client
    iterations = 1500  # long enough (a few seconds) that the poll below sees both points mid-training
    spec = grid(tmp_path, iterations=iterations, every=50, seeds="[1]")
    out = tmp_path / "out"
    args = ["--out", str(out), "--scheduler", shared_cluster["address"]]
    sweeping = subprocess.Popen([*CLI, "sweep", str(spec), *args, "-q"], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    victim, survivor = out / "runs" / "gru-none-K8-s1", out / "runs" / "gru-sinusoidal-K8-s1"
    with Client(shared_cluster["address"], timeout="30s") as client:
        deadline = time.monotonic() + 120
        # both mid-training, the victim 10-40 iterations past a checkpoint (its log then holds lines the
        # resumed run must redo); a wide window, so a slow poll on a loaded machine does not miss it
        while not (all(r.is_dir() and list_checkpoints(r) for r in (victim, survivor))
                   and logged_iteration(victim) % 50 in (10, 20, 30, 40)):
            assert sweeping.poll() is None and time.monotonic() < deadline, sweeping.communicate()
            time.sleep(0.02)
        assert not any((r / "eval.json").exists() for r in (victim, survivor))
        running = {addr: keys for addr, keys in client.processing().items() if keys}
        where = [addr for addr, keys in running.items() if any(f"-{victim.name}-" in str(k) for k in keys)]
        assert len(running) == 2 and len(where) == 1, running  # one point per worker
        psutil.Process(client.run(os.getpid)[where[0]]).send_signal(signal.SIGKILL)
    stdout, stderr = sweeping.communicate(timeout=300)
    assert sweeping.returncode in (0, 1), stderr  # dask reschedules the task; if it gave up, the re-run finishes
    rerun = runner.invoke(app, ["sweep", str(spec), *args, "-q"])
    assert rerun.exit_code == 0, rerun.stderr + rerun.stdout
    points = check_outputs(out, [victim.name, survivor.name])
    # the killed point resumed from its last checkpoint instead of starting again; the other ran through
    assert points[victim.name]["steps"]["train"] == "resumed", stdout + json.dumps(points)
    assert points[survivor.name]["steps"]["train"] == "trained", stdout + json.dumps(points)
    for run in (victim, survivor):  # one log line per logged iteration: the redone work replaced, not appended
        logged = [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert logged == list(range(10, iterations + 1, 10))
