"""Every option of `gradscope stability`, `dynamics`, `accuracy` and `summarize` is declared once, as a field of its
options dataclass (gradscope/workflows/options.py): the flags are generated from the fields (name, help,
default), the command function writes none of them again, and a value is checked only in the
dataclass's __post_init__ (issue #39, part 2)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import typer
from typer.testing import CliRunner

from gradscope.cli.accuracy import accuracy_command
from gradscope.cli.app import app
from gradscope.cli.dynamics import dynamics_command
from gradscope.cli.stability import stability_command
from gradscope.cli.summarize import summarize_command
from gradscope.workflows.options import AccuracyOptions, DynamicsOptions, StabilityOptions, SummarizeOptions

CASES = [("stability", StabilityOptions, stability_command), ("dynamics", DynamicsOptions, dynamics_command),
         ("accuracy", AccuracyOptions, accuracy_command), ("summarize", SummarizeOptions, summarize_command)]


@pytest.mark.parametrize("name, cls, function", CASES)
def test_the_flags_are_the_dataclass_fields(name: str, cls: type, function) -> None:  # noqa: ANN001
    command = typer.main.get_command(app).commands[name]
    params = {p.name: p for p in command.get_params(typer.Context(command))}
    declared = [f for f in dataclasses.fields(cls) if "help" in f.metadata]
    assert len(declared) >= 8
    for f in declared:
        p = params[f.name]
        assert p.opts == ["--" + f.name.replace("_", "-")] and p.help == f.metadata["help"], f.name
        if f.default not in (None, ()):
            assert p.default == f.default, f.name
    written = set(inspect.signature(function).parameters)
    assert not written & {f.name for f in declared}, "an option written again in the command function"


@pytest.mark.parametrize("args, message", [
    (["stability", "x.pt", "--sv", "0"], "--sv: got 0; it must be between 1 and"),
    (["stability", "x.pt", "--estimator", "fast"], "--estimator: got 'fast'; valid values are auto, exact, sketch"),
    (["dynamics", "x.pt", "--parts", "flow,nope"], "--parts: got nope; valid parts are"),
    (["accuracy", "x.pt", "--bins", "0,3,1"], "--bins: got '0,3,1'; edges must start at 0 and increase"),
    (["accuracy", "x.pt", "--resamples", "0"], "--resamples: got 0; it must be between 1 and"),
    (["summarize", "x.zarr", "--ci", "1.5"], "--ci: got 1.5; it must lie strictly between 0 and 1"),
    (["summarize", "x.zarr", "--by", "core,,pe"], "--by: got 'core,,pe', an empty list or an empty item"),
    (["summarize", "x.zarr", "--method", "jackknife"], "--method: got 'jackknife'; valid values are percentile"),
    (["dynamics", "x.pt", "--qr-dtype", "float16"], "--qr-dtype: got 'float16'; valid values are float64, float32"),
])
def test_a_bad_value_is_refused_by_the_dataclass_before_any_file_is_read(args: list[str], message: str) -> None:
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_repeated_and_comma_separated_parts_are_one_list() -> None:
    assert DynamicsOptions(parts=("flow,grid", "lyapunov")).parts == ("flow", "grid", "lyapunov")
