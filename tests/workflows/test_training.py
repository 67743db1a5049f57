"""gradscope.workflows.training: `gradscope train` from Python. train_run plans the run (a new one from a preset and
settings, a resumed one, an extension) and trains it; the command is a shell over the same plan, so a run made
from Python is the run the command makes, and every rule between the options is refused in one line before the
run directory is touched."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import gradscope
from gradscope.cli.app import app
from gradscope.errors import GradscopeError
from gradscope.workflows.options import TrainOptions
from gradscope.workflows.training import TrainPlan, default_run_dir, plan_training, train_run

ROOT = Path(__file__).resolve().parents[2]
PARENT = ROOT / "sample_checkpoints" / "gru-none-s1"  # K = 64
SMALL = dict(vocab_size=8, length=4, hidden_size=16, embed_size=8, iterations=30, checkpoint_every=10, batch_size=16,
             heldout_size=32, grid_per_cell=2)


def flags(settings: dict) -> list[str]:
    return [x for k, v in settings.items() for x in ("--" + k.replace("_", "-"), str(v))]


def refused(message: str) -> pytest.RaisesContext:
    return pytest.raises(GradscopeError, match=f"^{re.escape(message)}")


def test_a_run_from_python_is_the_run_the_command_makes(tmp_path: Path) -> None:
    run = gradscope.train_run(tmp_path / "py", core="lstm", pe="sinusoidal", **SMALL)
    assert isinstance(run, gradscope.TrainRun) and run.run_dir == tmp_path / "py" and run.result["iteration"] == 30
    result = CliRunner().invoke(app, ["train", "-q", "-o", str(tmp_path / "cli"), "--core", "lstm", "--pe", "sinusoidal",
                                      *flags(SMALL)])
    assert result.exit_code == 0, result.stderr
    config = {d: json.loads((tmp_path / d / "config.json").read_text())["config"] for d in ("py", "cli")}
    assert config["py"] == config["cli"] and config["py"]["model"]["core"] == "lstm"
    a, b = (torch.load(tmp_path / d / "step-0000030.pt", weights_only=True)["model"] for d in ("py", "cli"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # same seed, same process: bit-equal
    assert json.loads((tmp_path / "py" / "eval.json").read_text()) == json.loads((tmp_path / "cli" / "eval.json").read_text())


def test_stop_after_then_resume_from_python(tmp_path: Path) -> None:
    out = tmp_path / "r"
    first = train_run(out, stop_after=10, **SMALL)
    assert first.result == {} and not (out / "eval.json").exists()
    second = train_run(resume=out)
    assert second.run_dir == out and second.result["iteration"] == 30 and second.config == first.config


def test_the_options_may_come_as_a_dataclass(tmp_path: Path) -> None:
    plan = plan_training(tmp_path / "x", TrainOptions(preset="tiny", beta2=0.98, max_length=None), {"core": "gru"})
    assert isinstance(plan, TrainPlan) and plan.config.train.betas[1] == 0.98 and not plan.resume
    run = train_run(tmp_path / "y", opts=TrainOptions(stop_after=10), **SMALL)
    assert run.result == {} and (tmp_path / "y" / "step-0000010.pt").is_file()


def test_each_rule_is_refused_in_one_line_before_anything_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # where a run without out would go (runs/)
    done = train_run(tmp_path / "done", stop_after=10, **SMALL).run_dir
    cases = [
        (dict(resume=done, core="gru"), "core: a resumed run keeps its own configuration and directory; leave it out"),
        (dict(resume=done, new_item_share=0.5), "new_item_share: a resumed run keeps its own configuration"),
        (dict(resume=tmp_path / "none"), f"resume: {tmp_path / 'none'} is not a gradscope run directory"),
        (dict(new_item_share=0.5), "new_item_share: only an extension of a checkpoint has new items; leave it out"),
        (dict(max_length=16, length=8), "max_length/length: got 16 and 8; they name the same setting (give one)"),
        (dict(resume=done, max_length=16), "max_length: a resumed run keeps its own configuration"),
        (dict(resume=done, preset="paper"), "preset: a resumed run keeps its own configuration"),
        (dict(extend_from=PARENT, preset="paper", vocab_size=80), "preset: an extension starts from its parent's"),
        (dict(extend_from=PARENT, vocab_size=80, iteratons=5), "iteratons: not a setting of a run; valid settings are"),
        (dict(hidden_sise=8), "hidden_sise: not a setting of a run"),
        (dict(extend_from=PARENT, hidden_size=8, vocab_size=80), "hidden_size: an extension keeps its parent's architecture"),
        (dict(extend_from=PARENT, beta1=0.5, vocab_size=80), "beta1: an extension keeps its parent's Adam betas"),
        (dict(extend_from=PARENT), "vocab_size: give the extended vocabulary size K'"),
        (dict(stop_after=0), "stop_after: got 0"),
    ]
    for overrides, message in cases:
        with refused(message):  # a resumed run takes no out (its own directory)
            train_run(None if "resume" in overrides else tmp_path / "new", **overrides)
        assert not (tmp_path / "new").exists() and not Path("runs").exists(), overrides
    with refused("out: a resumed run keeps its own configuration and directory; leave it out"):
        train_run(tmp_path / "other", resume=done)
    with refused("opts: got dict"):
        train_run(tmp_path / "new", opts={"preset": "tiny"})


def test_the_command_prints_the_rules_as_its_flags(tmp_path: Path) -> None:
    done = train_run(tmp_path / "done", stop_after=10, **SMALL).run_dir
    result = CliRunner().invoke(app, ["train", "-q", "--resume", str(done), "--core", "gru", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: --core/--out: a resumed run keeps its own configuration and directory; "
                                     "leave them out")


def test_an_extension_plan_takes_the_parents_model(tmp_path: Path) -> None:
    plan = plan_training(None, TrainOptions(extend_from=PARENT), {"vocab_size": 80, "iterations": 5})
    assert plan.extend_from == PARENT and plan.config.task.vocab_size == 80 and plan.config.task.old_items == 64
    assert plan.config.model.core == "gru" and plan.config.train.iterations == 5
    assert plan.run_dir.parent == Path("runs") and plan.run_dir.name.startswith("extend-gru-none-K80-s")


def test_default_run_dirs_are_numbered(tmp_path: Path) -> None:
    cfg = plan_training(tmp_path / "x", TrainOptions(), {}).config
    first = default_run_dir(cfg, "tiny", tmp_path)
    assert first.name == f"tiny-{cfg.model.core}-{cfg.model.pe}-K{cfg.task.vocab_size}-s{cfg.train.seed}"
    first.mkdir()
    assert default_run_dir(cfg, "tiny", tmp_path).name == first.name + "-2"
