"""Autoregressive decoding (paper App. B.2) against a greedy loop written here, teacher-forced inputs,
and a feedback model trained and evaluated both ways; training that cannot decode is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from tests.helpers.runs import COMPLEX_CORE, DEFAULT_CORE, OTHER_CORE, small_run
from gradscope.cli.app import app
from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.errors import GradscopeError
from gradscope.models import SeqModel
from gradscope.tasks.decoding import decode, decode_logits, teacher_inputs
from gradscope.tasks import make_task
from gradscope.train import train


def _feedback_model(core: str, K: int = 6) -> SeqModel:
    torch.manual_seed(0)
    model = SeqModel(ModelConfig(core=core, vocab_size=K, embed_size=8, hidden_size=12, pe="sinusoidal",
                                 max_len=16, feedback=True)).eval()
    with torch.no_grad():  # large logit margins, so argmax ties cannot flip between equal computations
        model.to_logits.weight.mul_(20.0)
    return model


def _greedy(model: SeqModel, raw: torch.Tensor) -> torch.Tensor:
    """Step-by-step greedy decoding of reverse, written from the paper's description: run the whole
    model on the sequence so far; the first output step reads the dummy (query) token, each later one
    the prediction made at the step before, as id K + 1 + token."""
    K = model.config.vocab_size
    n, L = raw.shape
    inputs = torch.cat([raw, torch.full((n, L), K)], dim=1)
    preds = torch.empty(n, L, dtype=torch.long)
    with torch.no_grad():
        for i in range(L):
            t = L + i
            if i > 0:
                inputs[:, t] = K + 1 + preds[:, i - 1]
            preds[:, i] = model(inputs[:, :t + 1])[:, t].argmax(-1)
    return preds


@pytest.mark.parametrize("core", [OTHER_CORE, DEFAULT_CORE, COMPLEX_CORE])
def test_autoregressive_decoding_equals_a_greedy_loop(core: str) -> None:
    model = _feedback_model(core)
    task = make_task(TaskConfig(name="reverse", vocab_size=6, length=5))
    batch = task.sample(32, torch.Generator().manual_seed(1))
    got = decode(model, batch.inputs, batch.targets, "autoregressive")[:, 5:]
    assert torch.equal(got, _greedy(model, batch.inputs[:, :5]))
    # its logits are those of the fused model on the self-fed inputs (the step recurrence agrees to float32 ulps)
    K = 6
    fed = torch.cat([batch.inputs[:, :6], K + 1 + got[:, :-1]], dim=1)
    with torch.no_grad():
        assert torch.allclose(decode_logits(model, batch.inputs, batch.targets, "autoregressive"), model(fed),
                              atol=2e-4, rtol=1e-4)


def test_teacher_inputs_feed_the_previous_target() -> None:
    K = 5
    inputs = torch.tensor([[0, 3, 1, K, K, K]])
    targets = torch.tensor([[-100, -100, -100, 1, 3, 0]])
    assert teacher_inputs(inputs, targets, K).tolist() == [[0, 3, 1, K, K + 1 + 1, K + 1 + 3]]


def test_feedback_model_trains_and_reports_both(tmp_path: Path, runner) -> None:
    cfg = small_run(OTHER_CORE, iterations=10, distribution="uniform")
    cfg = RunConfig(model=ModelConfig(**{**cfg.model.__dict__, "feedback": True}), task=cfg.task,
                    train=TrainConfig(**{**cfg.train.__dict__, "decoding": "teacher"}))
    result = train(cfg, tmp_path / "run")
    assert {"uniform", "uniform_teacher"} <= set(result)
    out = runner.invoke(app, ["accuracy", "-q", str(tmp_path / "run"), "-o", str(tmp_path / "a.zarr")])
    assert out.exit_code == 0, out.output
    ds = xr.open_zarr(tmp_path / "a.zarr")
    assert list(ds["decoding"].values) == ["autoregressive", "teacher"]
    np.testing.assert_allclose(ds["decoded_token_accuracy"].values[-1],
                               [result["uniform"]["token_accuracy"], result["uniform_teacher"]["token_accuracy"]],
                               rtol=1e-6)
    assert "self-fed" in out.stdout and "ground truth fed" in out.stdout
    train(small_run(OTHER_CORE, iterations=10, distribution="uniform"), tmp_path / "standard")
    out = runner.invoke(app, ["accuracy", "-q", str(tmp_path / "run"), str(tmp_path / "standard"), "-o",
                              str(tmp_path / "mixed.zarr")])  # a feedback and a standard model: not one store
    assert out.exit_code == 2 and "evaluate them separately" in out.stderr and not (tmp_path / "mixed.zarr").exists()
    from gradscope.store.summary import trial_record  # summarize: each decoding's accuracy per seed
    metrics = trial_record(tmp_path / "a.zarr").metrics
    assert metrics["token_accuracy/teacher"] == pytest.approx(float(ds["decoded_token_accuracy"].values[-1, 1]))
    assert metrics["token_accuracy/autoregressive"] == pytest.approx(metrics["token_accuracy"])


def test_free_running_training_is_refused_where_it_cannot_run() -> None:
    with pytest.raises(GradscopeError, match="feedback"):
        RunConfig(model=ModelConfig(vocab_size=8), task=TaskConfig(vocab_size=8), train=TrainConfig(decoding="teacher"))
    with pytest.raises(GradscopeError, match="decoding"):
        RunConfig(model=ModelConfig(vocab_size=8, feedback=True), task=TaskConfig(name="copy", vocab_size=8),
                  train=TrainConfig(decoding="autoregressive"))
