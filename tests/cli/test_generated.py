"""Every option of `gradscope train`, `stability`, `dynamics`, `accuracy`, `summarize`, `report`, `reproduce`,
`sweep` and `corpus prepare` is declared once, as a field of its options dataclass (gradscope/workflows/options.py
and gradscope/workflows/study/options.py): the flags are generated from the fields (name, help, default), the
command function writes none of them again, and a value is checked only by the dataclass (its fields' ranges and
choices, then __post_init__'s rules between fields)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import typer
from typer.testing import CliRunner

from gradscope.fields import with_names
from gradscope.cli.accuracy import accuracy_command
from gradscope.cli.app import app
from gradscope.cli.corpus import prepare_command
from gradscope.cli.dynamics import dynamics_command
from gradscope.cli.report import report_command
from gradscope.cli.reproduce import reproduce_command
from gradscope.cli.stability import stability_command
from gradscope.cli.summarize import summarize_command
from gradscope.cli.sweep import sweep_command
from gradscope.cli.train import train_command
from gradscope.workflows.options import (AccuracyOptions, DynamicsOptions, SourceOptions, StabilityOptions,
                                         SummarizeOptions, TableOptions, TrainOptions)
from gradscope.workflows.study.options import (ClusterOptions, CorpusOptions, ReportOptions, StudyOptions,
                                               TextStudyOptions)

CASES = [("stability", StabilityOptions, stability_command), ("dynamics", DynamicsOptions, dynamics_command),
         ("accuracy", AccuracyOptions, accuracy_command), ("summarize", SummarizeOptions, summarize_command),
         ("report", ReportOptions, report_command), ("reproduce", StudyOptions, reproduce_command),
         ("reproduce", TextStudyOptions, reproduce_command),
         ("sweep", ClusterOptions, sweep_command), ("corpus prepare", CorpusOptions, prepare_command),
         ("stability", SourceOptions, stability_command), ("stability", TableOptions, stability_command),
         ("dynamics", SourceOptions, dynamics_command), ("accuracy", SourceOptions, accuracy_command),
         ("train", TrainOptions, train_command)]


@pytest.mark.parametrize("name, cls, function", CASES)
def test_the_flags_are_the_dataclass_fields(name: str, cls: type, function) -> None:  # noqa: ANN001
    command = typer.main.get_command(app)
    for word in name.split():
        command = command.commands[word]
    params = {p.name: p for p in command.get_params(typer.Context(command))}
    declared = [f for f in dataclasses.fields(cls) if "help" in f.metadata]
    assert len(declared) >= 2
    for f in declared:
        p = params[f.name]
        flag = "--" + (f.metadata.get("flag") or f.name).replace("_", "-")  # corpus prepare's vocab_size is --vocab
        assert p.opts == [flag, *f.metadata.get("also", ())] and p.help == with_names(f.metadata["help"]), f.name
        if f.default not in (None, (), dataclasses.MISSING):  # MISSING: a default_factory (sweep --resources: none)
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
    (["summarize", "x.zarr", "--interval", "jackknife"], "--interval: got 'jackknife'; valid values are percentile"),
    (["dynamics", "x.pt", "--qr-dtype", "float16"], "--qr-dtype: got 'float16'; valid values are float64, float32"),
    (["report", "x.zarr", "--seed", "-1"], "--seed: got -1; it must be between 0 and"),
    (["report", "x.zarr", "--static", "gif"], "--static: got 'gif'; valid formats are png, svg"),
    (["reproduce", "--seeds", "1,,2"], "--seeds: got '1,,2', which has an empty item"),
    (["reproduce", "--models", "gru,gru"], "--models: got gru, gru; a value repeats"),
    (["sweep", "x.toml", "--resources", "GPU"], "--resources: got 'GPU'; give NAME=AMOUNT pairs"),
    (["sweep", "x.toml", "--retries", "-1"], "--retries: got -1; it must be between 0 and 100"),
    (["corpus", "prepare", "x.txt", "-o", "c", "--model-type", "bytes"], "--model-type: got 'bytes'; valid values are"),
    (["corpus", "prepare", "x.txt", "-o", "c", "--vocab", "3"], "--vocab: got 3; need an integer in 4…"),
    (["stability", "x.pt", "--triplets", "abc"], "--triplets: got str 'abc'; expected an integer"),
    (["stability", "x.pt", "--score", "max"], "--score: got 'max'; valid values are default, frobenius, l1"),
    (["dynamics", "x.pt", "--budget-seconds", "fast"], "--budget-seconds: got 'fast'; it must be a finite number > 0"),
    (["train", "--stop-after", "-3"], "--stop-after: got -3; it must be between 1 and"),
    (["train", "--preset", "huge"], "--preset: got 'huge'; valid values are tiny, paper"),
])
def test_a_bad_value_is_refused_by_the_dataclass_before_any_file_is_read(args: list[str], message: str) -> None:
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("name", ["stability", "dynamics", "accuracy"])
def test_a_family_s_own_options_follow_the_command_s_own_in_help(name: str) -> None:
    from gradscope.workflows.families.options import FAMILY_OPTIONS
    command = typer.main.get_command(app).commands[name]
    order = [p.name for p in command.get_params(typer.Context(command))]
    own = [n for n in order if n not in FAMILY_OPTIONS and n in {f.name for f in dataclasses.fields(
        {"stability": StabilityOptions, "dynamics": DynamicsOptions, "accuracy": AccuracyOptions}[name])}]
    assert own and all(order.index(f) > order.index(own[-1]) for f in FAMILY_OPTIONS)
