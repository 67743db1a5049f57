"""The command line's wiring (``gradscope.cli.app``): every command is registered under its name with its
generated command class; click's usage errors (an unknown option or command, a missing argument or value)
are one `error:` line, exit status 2, naming the help to read; and the console script gives an analysis the
free cores, and nothing else. What each command does is its own test file's (tests/cli/test_<command>.py)."""

from __future__ import annotations

import sys

import pytest
import typer
from typer.testing import CliRunner

import gradscope.guard
from gradscope.cli import app as app_module
from gradscope.cli.accuracy import AccuracyCommand
from gradscope.cli.app import ANALYSES, OneLineGroup, _OneLineUsageError, app
from gradscope.cli.dynamics import DynamicsCommand
from gradscope.cli.report import ReportCommand
from gradscope.cli.reproduce import ReproduceCommand
from gradscope.cli.stability import StabilityCommand
from gradscope.cli.summarize import SummarizeCommand
from gradscope.cli.sweep import SweepCommand
from gradscope.cli.train import TrainCommand

COMMANDS = {"train": TrainCommand, "stability": StabilityCommand, "accuracy": AccuracyCommand,
            "dynamics": DynamicsCommand, "summarize": SummarizeCommand, "report": ReportCommand,
            "reproduce": ReproduceCommand, "sweep": SweepCommand}


def test_every_command_is_registered_with_its_class() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, OneLineGroup) and group.name == "gradscope"
    assert set(group.commands) == {*COMMANDS, "corpus"}
    for name, cls in COMMANDS.items():
        assert isinstance(group.commands[name], cls), name
    assert set(group.commands["corpus"].commands) == {"prepare"}  # a sub-app of its own


def one_line(runner: CliRunner, args: list[str]) -> str:
    """``gradscope ARGS`` fails with exit status 2 and one `error:` line on stderr, no traceback: that line."""
    done = runner.invoke(app, args)
    assert done.exit_code == 2 and isinstance(done.exception, SystemExit), (done.exit_code, done.exception)
    assert done.stdout == "" and done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    return done.stderr.rstrip("\n")


@pytest.mark.parametrize("args, line", [
    (["nope"], "error: No such command 'nope'. (see 'gradscope --help')"),
    (["accuracy"], "error: Missing argument 'checkpoints'. (see 'gradscope accuracy --help')"),
    (["train", "--iterations"], "error: Option '--iterations' requires an argument. (see 'gradscope train --help')"),
    (["corpus", "nope"], "error: No such command 'nope'. (see 'gradscope corpus --help')"),
    (["corpus", "prepare"], "error: Missing argument 'raw'. (see 'gradscope corpus --help')"),
    (["--nope"], "error: No such option: --nope"),  # the group's own options: no command to point to
])
def test_a_usage_error_is_one_line_naming_the_help(runner: CliRunner, args: list[str], line: str) -> None:
    assert one_line(runner, args) == line


def test_an_unknown_option_keeps_clicks_suggestion_on_the_one_line(runner: CliRunner) -> None:
    line = one_line(runner, ["train", "--nope"])
    assert line.startswith("error: No such option: --nope") and line.endswith("(see 'gradscope train --help')")
    assert "(Possible options:" in line


def test_the_error_is_its_message_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    error = _OneLineUsageError("Missing\n   argument  'x'.\n")
    assert error.exit_code == 2
    error.show()
    captured = capsys.readouterr()
    assert captured.err == "error: Missing argument 'x'.\n" and captured.out == ""


def test_no_arguments_show_the_help_not_an_error(runner: CliRunner) -> None:
    done = runner.invoke(app, [])
    shown = done.stdout + done.stderr
    assert shown.startswith("Usage: gradscope") and "error:" not in shown
    assert all(name in shown for name in [*COMMANDS, "corpus"])


@pytest.mark.parametrize("argv, cores", [
    *[([name, "x"], True) for name in ANALYSES],
    (["stability", "x", "--help"], False),
    (["dynamics", "-h"], False),
    (["train", "-o", "run"], False),
    (["summarize", "x.zarr"], False),
    (["report", "x.zarr"], False),
    (["x", "stability"], False),  # only the command, never an argument, decides
    ([], False),
])
def test_the_console_script_gives_an_analysis_the_free_cores(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                              cores: bool) -> None:
    calls: list[str] = []
    monkeypatch.setattr(gradscope.guard, "use_free_cores", lambda: calls.append("cores"))
    monkeypatch.setattr(app_module, "app", lambda: calls.append("app"))
    monkeypatch.setattr(sys, "argv", ["gradscope", *argv])
    app_module.main()
    assert calls == (["cores", "app"] if cores else ["app"])


def test_the_analyses_are_the_commands_that_compute() -> None:
    assert ANALYSES == ("stability", "dynamics", "accuracy", "reproduce")
