"""`gradscope sweep`: spec parsing, the per-point task, and real dask clusters (local, killed worker,
separate scheduler and worker processes)."""

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

import gradscope
from gradscope.cli.app import app
from gradscope.errors import GradscopeError
from gradscope.store import read_store
from gradscope.store.manifest import read_manifest
from gradscope.files.checkpoint import list_checkpoints
from gradscope.workflows.study.reproduce import Layout
from gradscope.workflows.sweep import parse_spec, plan_points, run_point

from tests.helpers.runs import logged_iteration

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from gradscope.cli.app import main; main()"]

# A 2 × 2 grid (PE × seed) of very small GRUs: seconds per point on one core.
GRID = """
name = "grid"
preset = "tiny"
[settings]
hidden_size = 16
embed_size = 8
vocab_size = 8
length = 4
heldout_size = 64
grid_per_cell = 2
batch_size = 16
iterations = {iterations}
checkpoint_every = {every}
warmup = 5
log_every = 10
[axes]
pe = ["none", "sinusoidal"]
seed = {seeds}
[accuracy]
checkpoints = "all"
[stability]
checkpoints = "last"
triplets = 2
"""


def grid(tmp_path: Path, iterations: int = 40, every: int = 20, seeds: str = "[1, 2]") -> Path:
    spec = tmp_path / "grid.toml"
    spec.write_text(GRID.format(iterations=iterations, every=every, seeds=seeds))
    return spec


def sweep(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process (cwd outside the repository, so the installed package is used)."""
    return subprocess.run([*CLI, "sweep", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def check_outputs(out: Path, names: list[str]) -> dict[str, dict]:
    """Every point done; every checkpoint loads; every store opens; nothing half-written is left."""
    manifest = read_manifest(out)
    points = {p["name"]: p for p in manifest["points"]}
    assert sorted(points) == sorted(names)
    for name, p in points.items():
        assert p["status"] == "done", p
        run = out / p["outputs"]["run"]
        assert (run / "eval.json").is_file()
        for ckpt in list_checkpoints(run):
            gradscope.load(ckpt)
        assert read_store(out / p["outputs"]["accuracy"], kind="accuracy").sizes["checkpoint"] >= 1
        assert read_store(out / p["outputs"]["stability"], kind="stability").sizes["checkpoint"] == 1
    leftovers = [p for p in out.rglob(".*") if p.name.endswith((".tmp", ".old"))]
    assert not leftovers, leftovers
    return points


# --- the spec ----------------------------------------------------------------------------------

def test_the_documented_example_spec_plans_a_2x2_grid() -> None:
    spec = parse_spec((REPO / "docs" / "sweep-tiny.toml").read_text())
    points = plan_points(spec)
    assert [p.name for p in points] == ["gru-none-K16-s111", "gru-none-K32-s111", "gru-sinusoidal-K16-s111",
                                        "gru-sinusoidal-K32-s111"]
    cfg = points[3].run.config
    assert (cfg.model.pe, cfg.task.vocab_size, cfg.model.hidden_size, cfg.train.iterations) == ("sinusoidal", 32, 32, 1500)
    assert cfg.model.vocab_size == 32 and cfg.model.max_len >= 2 * cfg.task.length + 1  # sized to the task
    assert spec.analyses.stability is not None and spec.analyses.stability.target_freq == ("frequent", "rare")


def test_other_axes_name_the_points(tmp_path: Path) -> None:
    spec = parse_spec('[axes]\nlr = [0.01, 0.003]\ncore = ["lstm"]\n')
    assert [p.name for p in plan_points(spec)] == ["lstm-none-K16-lr0.01-s111", "lstm-none-K16-lr0.003-s111"]
    assert [p.run.config.train.lr for p in plan_points(spec)] == [0.01, 0.003]
    assert spec.analyses.accuracy is None and spec.analyses.stability is None  # no tables: train only


@pytest.mark.parametrize("text, message", [
    ("[axes]\nseed = [1]\ncolour = [1]\n", "unknown key(s) 'colour' in [axes]"),
    ("[axes]\nseed = []\n", "give a non-empty list"),
    ("[axes]\nseed = [1, 1]\n", "repeated values"),
    ("[settings]\nseed = 1\n[axes]\nseed = [2]\n", "seed is both a setting and an axis"),
    ("[settings]\nhidden_size = \"32\"\n[axes]\nseed = [1]\n", "hidden_size: got '32'; expected int"),
    ("[axes]\ncore = [\"transformer\"]\n", "at core=transformer: core: got 'transformer'"),
    ("preset = \"huge\"\n[axes]\nseed = [1]\n", "preset: got 'huge'"),
    ("[axes]\nseed = [1]\n[stability]\ncheckpoints = [1234]\n", "there is none at 1234"),
    ("[settings]\ndistribution = \"uniform\"\n[axes]\nseed = [1]\n[stability]\ntarget_freq = [\"rare\"]\n",
     "no frequent/rare split"),
    ("[settings]\ntask = \"copy\"\n[axes]\nseed = [1]\n[stability]\n", "stability probes are defined for"),
    ("[axes]\nseed = [1]\n[stability]\ntriplets = 0\n", "triplets: got 0"),
    ("[axes]\nseed = [1\n", "not valid TOML"),
    ("[settings]\nhidden_size = 8\n", "give at least one axis"),
])
def test_bad_specs_are_one_line_errors(text: str, message: str, runner: CliRunner, tmp_path: Path) -> None:
    with pytest.raises(GradscopeError, match=None) as err:
        plan_points(parse_spec(text))
    assert message in str(err.value)
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    result = runner.invoke(app, ["sweep", str(spec), "--dry-run"])
    assert result.exit_code == 2 and result.stderr.startswith("error: spec") and result.stderr.count("\n") <= 2


def test_dry_run_lists_the_grid_and_runs_nothing(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["sweep", str(grid(tmp_path)), "--dry-run", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.stderr
    assert "gru-sinusoidal-K8-s2" in result.stdout and "to run" in result.stdout
    assert not (tmp_path / "out").exists()
    both = runner.invoke(app, ["sweep", str(grid(tmp_path)), "--scheduler", "tcp://127.0.0.1:1", "--workers", "2",
                               "-o", str(tmp_path / "o2")])
    assert both.exit_code == 2 and "--workers" in both.stderr
    bad = runner.invoke(app, ["sweep", str(grid(tmp_path)), "--resources", "GPU", "-o", str(tmp_path / "o3")])
    assert bad.exit_code == 2 and "--resources: got 'GPU'" in bad.stderr and not (tmp_path / "o3").exists()


# --- one point, without dask -------------------------------------------------------------------

def test_run_point_resumes_and_skips_and_cleans_up_after_a_kill(tmp_path: Path) -> None:
    from gradscope.train import train
    spec = parse_spec(grid(tmp_path, seeds="[1]").read_text())
    point = plan_points(spec)[0]
    layout = Layout(tmp_path / "out")
    # a run killed before its first checkpoint: config and log only, plus a half-written checkpoint file
    train(point.run.config, layout.run(point.run), stop_after=3)
    for ckpt in list_checkpoints(layout.run(point.run)):
        ckpt.unlink()
    (layout.run(point.run) / ".step-0000020.pt.abc.tmp").write_bytes(b"half")
    (layout.root / "stores" / f".accuracy-{point.name}.zarr.xyz.tmp").mkdir(parents=True)
    outcome = run_point(point, str(layout.root), spec.analyses, threads=1)
    assert dict(outcome.steps) == {"train": "trained", "accuracy": "written", "stability": "written"}
    assert layout.accuracy(point.run).is_dir() and layout.stability(point.run).is_dir()
    assert not list(layout.root.rglob("*.tmp"))
    again = run_point(point, str(layout.root), spec.analyses, threads=1)
    assert set(dict(again.steps).values()) == {"done earlier"}


def test_the_paper_scale_example_plans_60_points() -> None:
    spec = parse_spec((REPO / "docs" / "sweep-paper-vocab.toml").read_text())
    points = plan_points(spec)
    assert len(points) == 60 and len({p.name for p in points}) == 60
    cfg = points[-1].run.config
    assert (cfg.model.hidden_size, cfg.task.length, cfg.train.iterations, cfg.train.seed) == (512, 64, 300_000, 555)
    assert (cfg.task.vocab_size, cfg.model.pe) == (1024, "sinusoidal") and spec.analyses.stability_checkpoints[-1] == 300_000


def test_a_directory_holding_other_settings_is_refused_before_anything_runs(runner: CliRunner, tmp_path: Path) -> None:
    from gradscope.store.manifest import write_manifest
    from gradscope.train import train
    spec, out = grid(tmp_path, seeds="[1]"), tmp_path / "out"
    parsed = parse_spec(spec.read_text())
    write_manifest(out.mkdir() or out, {"analyses": {"accuracy": None}}, [])  # a sweep made with other analyses
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(out)])
    assert result.exit_code == 2 and "analyses ([accuracy]/[stability]) differ" in result.stderr
    (out / "sweep.json").unlink()
    point = plan_points(parsed)[0]
    other = plan_points(parse_spec(GRID.format(iterations=60, every=20, seeds="[1]")))[0]
    train(other.run.config, Layout(out).run(point.run), stop_after=2)  # same name, other configuration
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(out)])
    assert result.exit_code == 2 and f"different configuration than this spec ({point.name})" in result.stderr
    assert not (out / "sweep.json").exists() and gradscope.load(Layout(out).run(point.run)).iteration == 2


# --- real clusters -----------------------------------------------------------------------------
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
            client.run(exec, "import gradscope.workflows.sweep")  # all ready: the fault test needs them in step
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


def test_a_sweep_whose_analyses_differ_is_refused(tmp_path: Path) -> None:
    """A sweep's manifest records its analyses' options by field name: the same spec on that directory resumes;
    a spec whose analyses differ is refused (their stores would mix settings)."""
    from gradscope.store.manifest import write_manifest

    spec_file = tmp_path / "spec.toml"
    spec_file.write_text('name = "s"\npreset = "tiny"\n[axes]\nseed = [1]\n[stability]\ntriplets = 4\n')
    described = parse_spec(spec_file.read_text()).analyses.describe()
    out = tmp_path / "sweep"
    out.mkdir()
    write_manifest(out, {"name": "s", "spec": spec_file.read_text(), "command": "", "analyses": described}, [])
    result = CliRunner().invoke(app, ["sweep", str(spec_file), "--out", str(out), "--dry-run"])
    assert result.exit_code == 0, result.output
    described["stability"]["triplets"] = 8
    write_manifest(out, {"name": "s", "spec": spec_file.read_text(), "command": "", "analyses": described}, [])
    result = CliRunner().invoke(app, ["sweep", str(spec_file), "--out", str(out), "--dry-run"])
    assert result.exit_code == 2 and "differ from this spec's" in result.stderr, result.output


def test_a_spec_names_the_target_position_as_the_flag_does() -> None:
    """[stability] target_pos, as --target-pos; position, an old name, is an unknown key."""
    base = 'name = "s"\npreset = "tiny"\n[axes]\nseed = [1]\n[stability]\ntriplets = 4\n'
    assert parse_spec(base + "target_pos = 3\n").analyses.stability.target_pos == 3
    with pytest.raises(GradscopeError, match=r"position"):
        parse_spec(base + "position = 3\n")
