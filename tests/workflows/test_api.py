"""One API level per job (issue #24): the workflow functions share one signature shape
``(source, *, options…) → xarray.Dataset``, take a path or a loaded checkpoint (never read again),
and name their options as the CLI's flags; summarize gives in Python the numbers the CLI prints."""

from __future__ import annotations

import dataclasses
import inspect
import shutil
from pathlib import Path

import numpy as np
import pytest
import typer
import typer.testing

import gradscope
from gradscope.cli.app import app
from gradscope.store.io import write_store
from gradscope.workflows.options import AccuracyOptions, DynamicsOptions, SummarizeOptions
from gradscope.workflows.stability import StabilityOptions

ROOT = Path(__file__).resolve().parents[2]
RUNS = [ROOT / "sample_checkpoints" / f"gru60k-none-s{s}" for s in (2, 5)]
CKPT = RUNS[0] / "step-0060000.pt"
# what a command's function takes beside its options: a model in memory's own probes (dynamics)
PYTHON_ONLY = {"stability": set(), "dynamics": {"tokens", "trajectory_tokens", "counts"}, "accuracy": set(),
               "summarize": set()}
OPTIONS = {"stability": StabilityOptions, "dynamics": DynamicsOptions, "accuracy": AccuracyOptions,
           "summarize": SummarizeOptions}


def _flags(command) -> set[str]:  # noqa: ANN001 - every option, those generated from an options dataclass too
    return {opt.lstrip("-").replace("-", "_") for p in command.get_params(typer.Context(command)) for opt in p.opts}


def test_every_workflow_function_has_one_shape() -> None:
    """``f(source, *, opts=None, **overrides)``: the options dataclass is the only place where an option's name,
    default, bounds and help live; the function repeats none of them."""
    for name, cls in OPTIONS.items():
        params = list(inspect.signature(getattr(gradscope, name)).parameters.values())
        assert params[0].name == "source" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
        assert params[1].name == "opts" and params[1].kind is params[1].KEYWORD_ONLY and params[1].default is None
        assert params[-1].kind is params[-1].VAR_KEYWORD, name
        assert {p.name for p in params[2:-1]} == PYTHON_ONLY[name], name


def test_every_option_field_is_a_flag_of_its_command() -> None:
    commands = typer.main.get_command(app).commands
    for name, cls in OPTIONS.items():
        fields = {f.name for f in dataclasses.fields(cls) if "help" in f.metadata}
        assert fields and fields <= _flags(commands[name]), (name, sorted(fields - _flags(commands[name])))


def test_overrides_set_over_opts_and_an_unknown_name_is_one_error() -> None:
    from gradscope.fields import with_overrides

    base = StabilityOptions(triplets=5, seed=3)
    assert with_overrides(StabilityOptions, base, {"seed": 4}, "stability") == StabilityOptions(triplets=5, seed=4)
    assert with_overrides(StabilityOptions, None, {}, "stability") == StabilityOptions()
    # the names before the options were named as their flags are gone (nothing was released): one line each
    for call, old in ((lambda: gradscope.stability(CKPT, position=3), "position"),
                      (lambda: gradscope.stability(CKPT, probes_file=ROOT / "x.npy"), "probes_file"),
                      (lambda: gradscope.dynamics(CKPT, warmup=3), "warmup"),
                      (lambda: gradscope.summarize("nothing-*.zarr", method="t"), "method"),
                      (lambda: gradscope.accuracy(CKPT, chunk=7), "chunk")):
        with pytest.raises(gradscope.GradscopeError, match=f"^{old}: not an option of"):
            call()
    for cls, old in ((StabilityOptions, "top_sv"), (DynamicsOptions, "warmup"), (AccuracyOptions, "chunk"),
                     (SummarizeOptions, "method")):
        with pytest.raises(TypeError):
            cls(**{old: 1})
    with pytest.raises(gradscope.GradscopeError, match="opts: got DynamicsOptions"):
        gradscope.stability(CKPT, opts=DynamicsOptions())


def test_an_old_flag_is_refused_in_one_line(tmp_path: Path) -> None:
    runner = typer.testing.CliRunner()
    for args in (["dynamics", str(CKPT), "--warmup", "3"], ["stability", str(CKPT), "--budget-seconds", "5"],
                 ["summarize", str(CKPT), "--method", "t"], ["train", "--vocab", "8"],
                 ["reproduce", "--model", str(tmp_path)]):
        result = runner.invoke(app, [*args, "-o", str(tmp_path / "x")])
        assert result.exit_code == 2 and "No such option" in result.output + result.stderr, args


def test_a_loaded_checkpoint_is_not_read_again(tmp_path: Path) -> None:
    """accuracy and dynamics on a Loaded equal them on its file, with the file gone meanwhile."""
    copy = tmp_path / "step-0060000.pt"
    shutil.copy(CKPT, copy)
    loaded = gradscope.load(copy)
    by_path = gradscope.accuracy(copy), gradscope.dynamics(copy, parts="flow", sequences=1)
    copy.unlink()
    by_loaded = gradscope.accuracy(loaded), gradscope.dynamics(loaded, parts="flow", sequences=1)
    for a, b in zip(by_path, by_loaded):
        for name in ("token_accuracy", "grid_bin_accuracy", "flow_fro"):
            if name in a:
                np.testing.assert_allclose(a[name].values, b[name].values, rtol=1e-6, atol=1e-9)
    assert "token_accuracy" in by_path[0] and "flow_fro" in by_path[1]


def test_summarize_in_python_gives_the_cli_numbers(tmp_path: Path) -> None:
    stores = []
    for run in RUNS:
        ds = gradscope.accuracy(run / "step-0060000.pt")
        stores.append(write_store(ds, tmp_path / f"acc-{run.name}.zarr"))
    summary = gradscope.summarize(stores, resamples=200)
    row = summary.sel(metric="token_accuracy").isel(group=0)
    per_seed = [float(gradscope.summarize(s, resamples=200).sel(metric="token_accuracy")["mean"].values[0])
                for s in stores]
    assert int(row["n"]) == 2 and abs(float(row["mean"]) - np.mean(per_seed)) < 1e-12
    out = tmp_path / "cli.zarr"
    result = typer.testing.CliRunner().invoke(app, ["summarize", *map(str, stores), "--resamples", "200", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    cli = gradscope.store.read_store(out)
    for name in ("mean", "low", "high", "n"):
        np.testing.assert_allclose(cli[name].values, summary[name].values, rtol=1e-12, equal_nan=True)
