"""One API level per job (issue #24): the workflow functions share one signature shape
``(source, *, options…) → xarray.Dataset``, take a path or a loaded checkpoint (never read again),
and name their options as the CLI's flags; summarize gives in Python the numbers the CLI prints."""

from __future__ import annotations

import inspect
import shutil
import warnings
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
# Python-only options: what a command takes in another form (a file, a model of your own), or not at all
PYTHON_ONLY = {"stability": {"probes", "split"}, "dynamics": {"tokens", "trajectory_tokens", "counts", "options"},
               "accuracy": set(), "summarize": {"source"}}


def _flags(command) -> set[str]:  # noqa: ANN001 - every option, those generated from an options dataclass too
    return {opt.lstrip("-").replace("-", "_") for p in command.get_params(typer.Context(command)) for opt in p.opts}


def test_workflow_options_are_named_as_the_flags() -> None:
    commands = typer.main.get_command(app).commands
    for name in ("stability", "accuracy", "dynamics", "summarize"):
        params = inspect.signature(getattr(gradscope, name)).parameters
        first, *rest = params.values()
        assert first.name == "source" and first.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
        assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in rest), f"{name}: options are keywords only"
        flags = _flags(commands[name])
        options = {p.name for p in rest if p.kind is p.KEYWORD_ONLY}
        assert options - PYTHON_ONLY[name] <= flags, f"{name}: {sorted(options - PYTHON_ONLY[name] - flags)} have no flag"
    fields = {f for f in StabilityOptions.__dataclass_fields__ if f not in ("token_counts", "length", "filler", "split")}
    flags = _flags(commands["stability"])
    assert {f for f in fields if StabilityOptions.__dataclass_fields__[f]._field_type.name == "_FIELD"} <= flags


def test_a_function_option_defaults_to_its_options_field() -> None:
    """A workflow function that spells its options out (rather than taking **options) gives each the default
    of its options dataclass's field: declared once there, only repeated in the signature for help()."""
    import dataclasses

    from gradscope.workflows.study_options import TextStudyOptions

    pairs = [(gradscope.stability, StabilityOptions), (gradscope.accuracy, AccuracyOptions),
             (gradscope.summarize, SummarizeOptions), (gradscope.reproduce_text, TextStudyOptions)]
    for function, cls in pairs:
        fields = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        shared = [p for p in inspect.signature(function).parameters.values() if p.name in fields]
        assert len(shared) >= 8, function.__name__  # the check sees the options it is about
        for p in shared:
            field = fields[p.name]
            assert p.default == field or {p.default, field} <= {None, ()}, (function.__name__, p.name, p.default, field)


def test_old_option_names_still_work_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="target_pos"):
        opts = StabilityOptions(position=3, top_sv=5, chunk=7)
    assert (opts.target_pos, opts.sv, opts.batch_size) == (3, 5, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert StabilityOptions(target_pos=3).target_pos == 3
    with pytest.warns(DeprecationWarning, match="probes="), pytest.raises(gradscope.GradscopeError, match="gone.npy"):
        gradscope.stability(CKPT, probes_file=ROOT / "gone.npy")  # the old name is used, not dropped


@pytest.mark.parametrize("make", [
    lambda: SummarizeOptions(method="bca", interval="t"),
    lambda: DynamicsOptions(top_sv=4, sv=16),
    lambda: DynamicsOptions(warmup=4, lyap_warmup=5),
    lambda: AccuracyOptions(chunk=7, batch_size=99),
    lambda: StabilityOptions(position=3, target_pos=5),
    lambda: gradscope.summarize("nothing-*.zarr", method="t", interval="bca"),
    lambda: gradscope.dynamics(CKPT, warmup=3, lyap_warmup=4),
    lambda: gradscope.stability(CKPT, position=3, target_pos=5),
    lambda: gradscope.stability(CKPT, budget_seconds=5, checkpoint_budget_seconds=6),
    lambda: gradscope.stability(CKPT, probes=ROOT / "new.npy", probes_file=ROOT / "old.npy")])
def test_an_old_name_given_with_its_new_one_is_refused(make) -> None:  # noqa: ANN001
    """Found in review: given both ways, the old name silently won (the new one set to another value than its
    default; a dataclass cannot tell its default given from left out, a function's keywords can)."""
    with pytest.raises(gradscope.GradscopeError, match="given twice, also as"):
        make()


def test_an_old_name_through_dataclasses_replace_warns_for_the_caller() -> None:
    """The warning is attributed to the first frame outside gradscope and dataclasses (second review: through
    dataclasses.replace it pointed into dataclasses.py, where Python's default filters hide it)."""
    import dataclasses

    for make in (lambda: dataclasses.replace(StabilityOptions(), budget_seconds=5.0),
                 lambda: dataclasses.replace(DynamicsOptions(), warmup=3),
                 lambda: SummarizeOptions(method="t")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make()
        assert [Path(w.filename).name for w in caught] == [Path(__file__).name], [w.filename for w in caught]


def test_a_script_sees_the_deprecation_warning_of_an_old_keyword(tmp_path: Path) -> None:
    """Python shows a DeprecationWarning only where it is attributed to the caller's own code (found in review:
    warned from inside gradscope, it was hidden from every script): each names the function the script called."""
    import subprocess
    import sys

    script = ("import gradscope\n"
              "for call in (lambda: gradscope.summarize('nothing-*.zarr', method='t'),\n"
              f"             lambda: gradscope.dynamics({str(CKPT)!r}, warmup=3, steps=2, parts='lyapunov', sv=1),\n"
              f"             lambda: gradscope.stability({str(CKPT)!r}, position=0)):\n"
              "    try:\n        call()\n    except gradscope.GradscopeError:\n        pass\n")
    (tmp_path / "user.py").write_text(script)
    done = subprocess.run([sys.executable, "user.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for said in ("summarize(method=…) is now interval=…", "dynamics(warmup=…) is now lyap_warmup=…",
                 "stability(position=…) is now target_pos=…"):
        assert said in done.stderr, done.stderr
    assert done.stderr.count("user.py:") >= 3  # attributed to the script's own lines


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
