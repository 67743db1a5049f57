"""`gradscope sweep`'s spec parsing and the per-point task (the real dask clusters:
tests/workflows/sweep/test_cluster.py; the command's dry run and refusals: tests/cli/test_sweep.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import gradscope
from gradscope.cli.app import app
from gradscope.errors import GradscopeError
from tests.helpers.runs import TINY_POINT_SETTINGS
from gradscope.store import read_store
from gradscope.store.manifest import read_manifest
from gradscope.files.checkpoint import list_checkpoints
from gradscope.workflows.study.reproduce import Layout
from gradscope.workflows.sweep.grid import parse_spec, plan_points, run_point


REPO = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-c", "from gradscope.cli.app import main; main()"]

# A 2 × 2 grid (PE × seed) of very small GRUs: seconds per point on one core.
GRID = """
name = "grid"
preset = "tiny"
[settings]
""" + TINY_POINT_SETTINGS + """iterations = {iterations}
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


def test_a_spec_names_the_target_position_as_the_flag_does() -> None:
    """[stability] target_pos, as --target-pos; position, an old name, is an unknown key."""
    base = 'name = "s"\npreset = "tiny"\n[axes]\nseed = [1]\n[stability]\ntriplets = 4\n'
    assert parse_spec(base + "target_pos = 3\n").analyses.stability.target_pos == 3
    with pytest.raises(GradscopeError, match=r"position"):
        parse_spec(base + "position = 3\n")


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
