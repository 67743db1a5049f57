"""A run's settings are named once, as their config fields : `gradscope train
--<field>`, a sweep spec's key and :func:`gradscope.presets.build_config`'s option are the same
name, so an error that names a field names the flag, with no table between them and no rewriting."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradscope.cli.app import app
from gradscope.config import ModelConfig, TaskConfig, TrainConfig
from gradscope.errors import GradscopeError
from gradscope.fields import option

TINY = ["--length", "4", "--embed-size", "4", "--iterations", "2", "--checkpoint-every", "2", "--batch-size", "4",
        "--heldout-size", "8", "--grid-per-cell", "1", "-q"]


def _help(runner: CliRunner) -> str:
    result = runner.invoke(app, ["train", "--help"])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_every_setting_is_its_config_field_and_a_train_flag(runner: CliRunner) -> None:
    """Each field declared with fields.option is a setting of its own name (the task's ``name`` is
    ``task``, as TaskConfig's errors say), shown by `gradscope train --help` as --<name>."""
    from gradscope.presets import settings

    known = settings()
    declared = {(f.metadata.get("flag") or f.name, section, f.name)
                for section, cls in (("model", ModelConfig), ("task", TaskConfig), ("train", TrainConfig))
                for f in dataclasses.fields(cls) if "help" in f.metadata}
    assert {(s.name, s.section, s.field) for s in known.values() if s.section != "core"} == declared
    assert {"core", "hidden_size", "embed_size", "num_layers", "vocab_size", "heldout_size", "task"} <= set(known)
    assert known["task"].field == "name" and known["core"].section == "model"
    text = _help(runner)
    for name in known:
        assert f"--{name.replace('_', '-')} " in text, name
    for old in ("--vocab ", "--hidden ", "--embed ", "--layers ", "--heldout ", "--model "):
        assert old not in text  # hidden: they still parse, with a warning


def test_a_setting_name_declared_twice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Names are unique across the sections and the cores' own options: a core whose own config
    declares ``hidden_size`` would make --hidden-size mean two things."""
    from gradscope.models import registry
    from gradscope.presets import settings

    @dataclasses.dataclass(frozen=True)
    class ClashConfig:
        hidden_size: int = option(4, "A second hidden size.")

    class Clash:
        Config = ClashConfig

    monkeypatch.setitem(registry.CORES, "clash", Clash)
    with pytest.raises(GradscopeError, match="hidden_size: declared by core and model"):
        settings()


@pytest.mark.parametrize("args, head", [
    (["--hidden-size", "0"], "--hidden-size: got 0"),
    (["--num-layers", "0"], "--num-layers: got 0"),
    (["--embed-size", "0"], "--embed-size: got 0"),
    (["--vocab-size", "1"], "--vocab-size: got 1"),
    (["--heldout-size", "0"], "--heldout-size: got 0"),
    (["--core", "transformer"], "--core: got 'transformer'"),
    (["--task", "nope"], "--task: got 'nope'"),
    (["--lr", "0"], "--lr: got 0"),
    (["--hidden-size", "x"], "--hidden-size: got 'x'"),
])
def test_a_field_error_names_the_flag(runner: CliRunner, tmp_path: Path, args: list[str], head: str) -> None:
    """The config's own check names the field, and that is the flag: one line, exit 2."""
    result = runner.invoke(app, ["train", "-o", str(tmp_path / "r"), "-q", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {head}") and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "r").exists()


def test_the_old_flags_are_refused_in_one_line(runner: CliRunner, tmp_path: Path) -> None:
    """The settings' names before they were named as their fields (--model, --vocab, --hidden, …) are gone:
    nothing was released, so a rename is free; each is an unknown option, and nothing is written."""
    for old in ("--model", "--vocab", "--hidden", "--layers", "--embed", "--heldout"):
        result = runner.invoke(app, ["train", "-o", str(tmp_path / "r"), old, "6", *TINY])
        assert result.exit_code == 2 and "No such option" in result.stderr, (old, result.stderr)
        assert not (tmp_path / "r").exists()


def test_a_core_option_is_recorded_in_the_command(runner: CliRunner, tmp_path: Path) -> None:
    """Settings are generated per call (the cores' own included); the run's recorded command lists
    them as the hand-written options (a core's own options were left out before)."""
    result = runner.invoke(app, ["train", "-o", str(tmp_path / "r"), "--core", "s4d", "--state-size", "4",
                                 "--vocab-size", "6", "--hidden-size", "6", *TINY])
    assert result.exit_code == 0, result.output
    command = json.loads((tmp_path / "r" / "config.json").read_text())["command"]
    assert "--state-size 4" in command and "--core s4d" in command and "--vocab-size 6" in command


def test_build_config_takes_the_field_names_only() -> None:
    from gradscope.presets import build_config

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the names warn of nothing
        build_config("tiny", {"core": "lstm", "vocab_size": 8, "hidden_size": 12, "embed_size": 6, "num_layers": 2,
                              "heldout_size": 64})
    with pytest.raises(GradscopeError, match="^hidden: not a setting of a run"):  # an old name is a misspelt one now
        build_config("tiny", {"hidden": 12})
    with pytest.raises(GradscopeError, match="^num_layers: got 0"):  # the field's own check, as it is
        build_config("tiny", {"num_layers": 0})
    with pytest.raises(GradscopeError, match="^hiden_size: not a setting of a run; valid settings are core, "):
        build_config("tiny", {"hiden_size": 8})  # a misspelt name was ignored, and the preset's H trained


def test_a_sweep_spec_takes_the_field_names() -> None:
    """A spec's keys are the settings' names; an old name is an unknown key."""
    from gradscope.workflows.sweep.grid import parse_spec, plan_points

    def spec(settings: str, axes: str) -> str:
        return f'name = "s"\n[settings]\n{settings}\niterations = 2\ncheckpoint_every = 2\n[axes]\n{axes}\n'

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = plan_points(parse_spec(spec('core = "gru"\nhidden_size = 8\nembed_size = 4',
                                          "vocab_size = [6, 8]\nnum_layers = [1, 2]")))
    assert [p.name for p in new] == ["gru-none-K6-num_layers1-s111", "gru-none-K6-num_layers2-s111",
                                     "gru-none-K8-num_layers1-s111", "gru-none-K8-num_layers2-s111"]
    with pytest.raises(GradscopeError, match="unknown key"):
        parse_spec(spec('model = "gru"', "seed = [1]"))
    with pytest.raises(GradscopeError, match="unknown key"):
        parse_spec(spec("hidden_sizes = 8", "seed = [1]"))


def test_sweep_refuses_an_old_spec_key_in_one_line(runner: CliRunner, tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text('name = "s"\n[settings]\nhidden = 8\nembed_size = 4\niterations = 2\ncheckpoint_every = 2\n'
                    '[axes]\nvocab_size = [6, 8]\n')
    result = runner.invoke(app, ["sweep", str(spec), "--dry-run", "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "hidden" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_summarize_groups_by_the_settings_names_as_train_spells_them() -> None:
    """One name per setting across commands: `summarize --by` takes vocab_size / vocab-size / core, as
    `gradscope train --vocab-size --core` names them, beside the short names it always took; both give
    the same summary fields (so summary stores are unchanged)."""
    from gradscope.errors import GradscopeError
    from gradscope.workflows.summarize import parse_by

    assert parse_by("core,pe,vocab_size,hidden-size,num_layers") == parse_by("model,pe,vocab,hidden,layers") \
        == ("core", "pe", "vocab_size", "hidden_size", "num_layers")
    with pytest.raises(GradscopeError, match="by: got 'vocab_sizes'"):
        parse_by("vocab_sizes")
