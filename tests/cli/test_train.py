"""`gradscope train` through the real CLI: success, help, and one-line errors with exit 2."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers.runs import OTHER_CORE
from gradscope.cli.app import app

SMALL = ["--vocab-size", "8", "--length", "4", "--hidden-size", "16", "--embed-size", "8", "--iterations", "30",
         "--checkpoint-every", "10", "--batch-size", "16", "--heldout-size", "32", "--grid-per-cell", "2", "-q"]


def test_help_lists_commands_and_options(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "train" in result.stdout
    result = runner.invoke(app, ["train", "--help"])
    assert result.exit_code == 0
    for option in ("--preset", "--resume", "--core", "--pe", "--rarity", "--beta2", "--stop-after"):
        assert option in result.stdout


def test_train_writes_a_run_directory(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "-o", str(tmp_path / "r"), "--core", OTHER_CORE, "--pe", "sinusoidal", *SMALL])
    assert result.exit_code == 0, result.stderr
    files = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert files == ["config.json", "eval.json", "metrics.jsonl", "step-0000010.pt", "step-0000020.pt",
                     "step-0000030.pt"]
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["format"] == "gradscope-run" and config["config"]["model"]["core"] == "lstm"
    assert config["config"]["model"]["vocab_size"] == 8 and "gradscope train" in config["command"]
    assert "held-out evaluation" in result.stdout


def test_stop_after_then_resume(runner: CliRunner, tmp_path: Path) -> None:
    run = str(tmp_path / "r")
    assert runner.invoke(app, ["train", "-o", run, *SMALL, "--stop-after", "10"]).exit_code == 0
    assert not (tmp_path / "r" / "eval.json").exists()
    result = runner.invoke(app, ["train", "--resume", run, "-q"])
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "r" / "eval.json").read_text())["iteration"] == 30


@pytest.mark.parametrize("args, message", [
    (["--task", "predecessor", "--vocab-size", "4", "--length", "8"], "vocab_size"),
    (["--vocab-size", "2", "--length", "3", "--heldout-size", "100"], "--heldout-size: got 100"),
    (["--core", "transformer"], "--core: got 'transformer'"),
    (["--hidden-size", "0"], "--hidden-size: got 0"),
    (["--iterations", "-5"], "iterations: got -5"),
    (["--rarity", "1.5"], "rarity"),
    (["--device", "cuda:7"], "device"),
    (["--preset", "huge"], "--preset"),
])
def test_bad_input_is_a_one_line_error(runner: CliRunner, tmp_path: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["train", "-o", str(tmp_path / "r"), "-q", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output + result.stderr
    assert not (tmp_path / "r").exists()


def test_existing_run_dir_and_bad_resume_are_refused(runner: CliRunner, tmp_path: Path) -> None:
    run = tmp_path / "r"
    assert runner.invoke(app, ["train", "-o", str(run), *SMALL]).exit_code == 0
    before = sorted(p.name for p in run.iterdir())
    again = runner.invoke(app, ["train", "-o", str(run), *SMALL])
    assert again.exit_code == 2 and "already exists" in again.stderr
    assert sorted(p.name for p in run.iterdir()) == before  # nothing lost
    not_run = runner.invoke(app, ["train", "--resume", str(tmp_path)])
    assert not_run.exit_code == 2 and "not a gradscope run" in not_run.stderr
    mixed = runner.invoke(app, ["train", "--resume", str(run), "--hidden-size", "8"])
    assert mixed.exit_code == 2 and "--hidden-size" in mixed.stderr


def test_resume_with_a_corrupt_checkpoint_fails_cleanly(runner: CliRunner, tmp_path: Path) -> None:
    run = tmp_path / "r"
    assert runner.invoke(app, ["train", "-o", str(run), *SMALL, "--stop-after", "10"]).exit_code == 0
    ckpt = run / "step-0000010.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    result = runner.invoke(app, ["train", "--resume", str(run)])
    assert result.exit_code == 2 and "cannot read" in result.stderr and "Traceback" not in result.stderr


def test_installed_distribution_has_no_bare_generic_modules() -> None:
    """cli/ and reports/ install as gradscope.cli and gradscope.reports, never as top-level modules."""
    dist = importlib.metadata.distribution("gradscope")
    assert (dist.read_text("top_level.txt") or "").split() == ["gradscope"]
    record = dist.read_text("RECORD") or ""
    if record and "__editable__" not in record:  # a regular (wheel) install lists every installed file
        tops = {line.split("/")[0] for line in record.splitlines() if line.split(",")[0].endswith(".py")}
        assert tops == {"gradscope"}, tops
    import gradscope.cli.app
    import gradscope.reports
    assert gradscope.cli.app.__name__ == "gradscope.cli.app" and gradscope.reports.__name__ == "gradscope.reports"


def test_help_lists_every_registered_task_core_and_pe(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """The choices in `gradscope train --help` come from the registries (a name registered at run time
    appears too); none is written by hand."""
    from gradscope.models.pe import PE_TYPES
    from gradscope.models.registry import CORES
    from gradscope.tasks.registry import TASKS

    monkeypatch.setitem(TASKS, "echo-test-task", TASKS["reverse"])
    result = runner.invoke(app, ["train", "--help"], terminal_width=400)
    assert result.exit_code == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip().startswith("--")}
    for flag, names in (("--task", TASKS), ("--core", CORES), ("--pe", PE_TYPES)):
        for name in names:
            assert name in lines[flag], (flag, name, lines[flag])
    assert "{" not in lines["--task"] and "echo-test-task" in result.stdout


def test_resume_before_the_first_checkpoint_starts_afresh(runner: CliRunner, tmp_path: Path) -> None:
    """A run killed before its first checkpoint (a config and a few log lines) resumes by starting again
    from iteration 0 with its recorded configuration, saying so, and ends as an uninterrupted run does."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert runner.invoke(app, ["train", "-o", str(whole), *SMALL]).exit_code == 0
    assert runner.invoke(app, ["train", "-o", str(killed), *SMALL, "--stop-after", "10"]).exit_code == 0
    for p in killed.glob("step-*.pt"):
        p.unlink()  # as if killed before its first checkpoint: its config and a log line are left
    recorded = json.loads((killed / "config.json").read_text())["command"]
    result = runner.invoke(app, ["train", "--resume", str(killed), "-q"])
    assert result.exit_code == 0, result.stderr
    assert "warning: resume:" in result.stderr and "iteration 0" in result.stderr
    assert json.loads((killed / "config.json").read_text())["command"] == recorded
    import torch
    a = torch.load(whole / "step-0000030.pt", weights_only=True)["model"]
    b = torch.load(killed / "step-0000030.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-6, atol=1e-7) for k in a)
    assert json.loads((killed / "eval.json").read_text())["iteration"] == 30
    stray = tmp_path / "stray"
    assert runner.invoke(app, ["train", "-o", str(stray), *SMALL, "--stop-after", "10"]).exit_code == 0
    for p in stray.glob("step-*.pt"):
        p.unlink()
    (stray / "notes.txt").write_text("mine")
    refused = runner.invoke(app, ["train", "--resume", str(stray), "-q"])
    assert refused.exit_code == 2 and "notes.txt" in refused.stderr and (stray / "notes.txt").exists()
