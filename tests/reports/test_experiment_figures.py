"""The experiments' per-position figures: a report of a continuous run, a feedback model's and an
extension's stores draws each one's own."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.runs import OTHER_CORE, small_run
from gradscope.cli.app import app
from gradscope.config import ModelConfig, RunConfig, TrainConfig
from gradscope.train import train
from tests.workflows.families.test_reverse_continuous import _continuous


def test_report_draws_the_experiments_per_position(tmp_path: Path, runner) -> None:
    """A report of a continuous run's store, a feedback model's and an extension's draws each one's
    per-position figure (and reads the continuous run's eval.json, which has no token accuracy)."""
    cfg = _continuous(iterations=4)
    train(cfg, tmp_path / "cont")
    fb = small_run(OTHER_CORE, iterations=4, distribution="uniform")
    fb = RunConfig(model=ModelConfig(**{**fb.model.__dict__, "feedback": True}), task=fb.task,
                   train=TrainConfig(**{**fb.train.__dict__, "decoding": "teacher"}))
    train(fb, tmp_path / "fb")
    parent = small_run(iterations=4, distribution="uniform")
    train(parent, tmp_path / "parent")
    r = runner.invoke(app, ["train", "-q", "--extend-from", str(tmp_path / "parent"), "--vocab-size",
                            str(parent.task.vocab_size + 4), "--iterations", "2", "-o", str(tmp_path / "ext")])
    assert r.exit_code == 0, r.output
    for run in ("cont", "fb", "ext"):
        fast = ["--resamples", "100"] if run == "cont" else []  # the bootstrap of a vector task's cosine only
        r = runner.invoke(app, ["accuracy", "-q", str(tmp_path / run), *fast, "-o", str(tmp_path / f"{run}.zarr")])
        assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["report", *(str(tmp_path / n) for n in ("cont", "cont.zarr", "fb.zarr", "ext.zarr")),
                            "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text()
    for heading in ("Continuous vocabulary: cosine similarity per position",
                    "Decoding: self-fed beside ground-truth fed accuracy",
                    "Vocabulary extension: accuracy on old and new items", "Training curves"):
        assert f"<h2>{heading}" in page
