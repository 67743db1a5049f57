"""The held-out evaluation at the end of training: a family of vector positions records the scores it
declares, in what `train` prints, in eval.json and in what is read back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def test_a_family_of_vector_positions_records_the_held_out_scores_it_declares(monkeypatch: pytest.MonkeyPatch,
                                                                                tmp_path: Path) -> None:
    """Task.heldout_scores (issue #39): what a family of vector positions declares is what `train` prints, what
    eval.json holds and what read_evaluation reads back; no layer looks for a score by its name (found in review:
    the printout, read_evaluation and the report expected token_accuracy or cosine_similarity)."""
    from typer.testing import CliRunner

    from gradscope.cli.app import app
    from gradscope.files.rundir import read_evaluation
    from gradscope.tasks.registry import TASKS

    base = next(c for c in TASKS.values() if c.inputs == "vectors")

    class Squared(base):  # type: ignore[misc, valid-type]
        name = "squared"

        @classmethod
        def heldout_scores(cls, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
            scored = ~targets[..., 0].isnan()
            return {"mean_squared_error": float(((outputs[scored] - targets[scored]) ** 2).mean())}

    monkeypatch.setitem(TASKS, "squared", Squared)
    run = tmp_path / "run"
    done = CliRunner().invoke(app, ["train", "--task", "squared", "--dim", "3", "--length", "4", "--embed-size", "4",
                                    "--hidden-size", "6", "--iterations", "2", "--heldout-size", "8",
                                    "--batch-size", "4", "-o", str(run)])
    assert done.exit_code == 0, (done.exception, done.stderr)
    evaluation = read_evaluation(run)
    assert evaluation is not None and set(evaluation["uniform"]) == {"n", "mean_squared_error"}
    assert evaluation["uniform"]["mean_squared_error"] > 0
    assert f"(n=8): mean squared error {evaluation['uniform']['mean_squared_error']:.4f}" in done.stdout
