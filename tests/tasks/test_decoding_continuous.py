"""Autoregressive decoding (paper App. B.2) against a greedy loop written here, and the continuous
task (App. B.3): cosine similarity against a hand computation, training, accuracy store, errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from tests.helpers.runs import COMPLEX_CORE, DEFAULT_CORE, OTHER_CORE, small_run
from gradscope.analysis.cosine import cosine_similarity, position_mean_ci
from gradscope.cli.app import app
from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.errors import GradscopeError
from gradscope.models import SeqModel
from gradscope.tasks.decoding import decode, decode_logits, teacher_inputs
from gradscope.tasks import make_task
from gradscope.files.checkpoint import load
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


def test_cosine_similarity_by_hand() -> None:
    preds = torch.tensor([[[3.0, 4.0], [1.0, 0.0], [0.0, 0.0]]])  # (1, 3, 2)
    targets = torch.tensor([[[0.6, 0.8], [-1.0, 1.0], [1.0, 0.0]]])
    nan = float("nan")
    targets_unscored = torch.tensor([[[nan, nan], [-1.0, 1.0], [1.0, 0.0]]])
    # (3·0.6 + 4·0.8) / (5 · 1) = 1;  (−1) / (1 · √2);  a zero prediction has no direction
    got = cosine_similarity(preds, targets)
    assert got[0, 0] == pytest.approx(1.0, abs=1e-15) and got[0, 1] == pytest.approx(-1 / math.sqrt(2), abs=1e-15)
    assert math.isnan(got[0, 2])
    assert math.isnan(cosine_similarity(preds, targets_unscored)[0, 0])


def test_position_ci_matches_scipy_and_brackets_the_mean() -> None:
    from scipy import stats

    values = np.random.default_rng(3).normal(0.5, 0.1, size=(64, 3))
    mean, low, high = position_mean_ci(values, resamples=2000, seed=4)
    np.testing.assert_allclose(mean, values.mean(0), rtol=1e-12)
    ref = stats.bootstrap((values[:, 1],), np.mean, n_resamples=2000, method="percentile",
                          rng=np.random.default_rng(4)).confidence_interval
    assert np.all(low < mean) and np.all(mean < high)
    assert abs(low[1] - ref.low) < 0.01 and abs(high[1] - ref.high) < 0.01  # same bootstrap, other resample draws
    assert np.isnan(position_mean_ci(np.ones((5, 2)))[1]).all()  # all equal: no interval


def _continuous(dim: int = 4, pe: str = "none", iterations: int = 30) -> RunConfig:
    task = TaskConfig(name="reverse-continuous", dim=dim, length=3, heldout_size=32)
    return RunConfig(model=ModelConfig(core=DEFAULT_CORE, vocab_size=dim, embed_size=8, hidden_size=16, pe=pe, max_len=8,
                                       inputs="vectors"),
                     task=task, train=TrainConfig(iterations=iterations, batch_size=32, lr=1e-2, warmup=2,
                                                  checkpoint_every=15, log_every=5, seed=3))


def test_continuous_tokens_lie_on_the_sphere_and_reverse() -> None:
    task = make_task(TaskConfig(name="reverse-continuous", dim=5, length=4))
    batch = task.sample(10, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (10, 8, 6) and batch.targets.shape == (10, 8, 5)
    x = batch.inputs[:, :4, :5]
    torch.testing.assert_close(x.norm(dim=-1), torch.ones(10, 4))
    assert torch.equal(batch.targets[:, 4:], x.flip(1)) and batch.targets[:, :4].isnan().all()
    assert torch.equal(batch.inputs[:, 4:, 5], torch.ones(10, 4)) and not batch.inputs[:, 4:, :5].any()
    again = task.sample(10, torch.Generator().manual_seed(0))
    assert torch.equal(again.inputs, batch.inputs)


def test_continuous_training_accuracy_store_and_resume(tmp_path: Path, runner) -> None:
    cfg = _continuous()
    result = train(cfg, tmp_path / "full")
    assert train(cfg, tmp_path / "split", stop_after=15) == {}
    train(cfg, tmp_path / "split", resume=True)
    a, b = load(tmp_path / "full").model.state_dict(), load(tmp_path / "split").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    loaded = load(tmp_path / "full")
    assert tuple(loaded.model.embedding.weight.shape) == (8, 5)  # Linear(d + 1, E): the last column is the query
    out = runner.invoke(app, ["accuracy", "-q", str(tmp_path / "full"), "--resamples", "200", "-o",
                              str(tmp_path / "c.zarr")])
    assert out.exit_code == 0, out.output
    ds = xr.open_zarr(tmp_path / "c.zarr")
    held = loaded.heldout.uniform
    with torch.no_grad():
        pred = loaded.model(held.inputs)[:, 3:]  # (n, L, d)
    target = held.targets[:, 3:]
    by_hand = ((pred * target).sum(-1) / (pred.norm(dim=-1) * target.norm(dim=-1))).double()  # (n, L)
    np.testing.assert_allclose(ds["position_cosine"].values[-1], by_hand.mean(0).numpy(), atol=1e-5)
    assert ds["cosine_similarity"].values[-1] == pytest.approx(result["uniform"]["cosine_similarity"], abs=1e-6)
    assert list(ds["time"].values) == [4, 5, 6]
    assert np.all(ds["position_cosine_low"].values <= ds["position_cosine"].values)
    assert "mean cosine" in out.stdout


def test_continuous_bad_input_is_one_line_exit_2(tmp_path: Path, runner) -> None:
    cfg = _continuous(iterations=2)
    train(cfg, tmp_path / "c")
    cases = [
        (["train", "--task", "reverse-continuous", "--length", "3"], "--dim: got 0"),
        (["train", "--extend-from", str(tmp_path / "c"), "--vocab-size", "8"], "no vocabulary to extend"),
        (["train", "--extend-from", str(tmp_path / "c"), "--vocab-size", "8", "--dim", "6"], "--dim: got 6"),
        (["accuracy", str(tmp_path / "c"), "--decoding", "teacher"], "--decoding: got 'teacher'"),
    ]
    for args, message in cases:
        result = runner.invoke(app, [*args, "-q", "-o", str(tmp_path / "out")])
        assert result.exit_code == 2 and message in result.stderr, (args, result.output)
        assert len(result.stderr.strip().splitlines()) == 1


def test_vector_probe_ids_read_the_table_and_the_query() -> None:
    from gradscope.tasks.reverse_continuous import probe_table, vector_probe_model

    torch.manual_seed(0)
    model = SeqModel(ModelConfig(core=OTHER_CORE, vocab_size=4, embed_size=6, hidden_size=8, pe="sinusoidal", max_len=8,
                                 inputs="vectors"))
    probe = vector_probe_model(model, seed=7)
    table = probe_table(4, 7)
    assert torch.equal(probe.table, table) and probe.query_token == table.shape[0]
    torch.testing.assert_close(table.norm(dim=-1), torch.ones(table.shape[0]))
    ids = torch.tensor([[5, 0, 17, probe.query_token, probe.query_token]])
    by_hand = torch.zeros(1, 5, 5)
    by_hand[0, :3, :4] = table[[5, 0, 17]]
    by_hand[0, 3:, 4] = 1.0  # the query flag; its coordinates are zero
    assert torch.equal(probe.core_inputs(ids), model.core_inputs(by_hand))
    assert torch.equal(probe(ids), model(by_hand))


def test_stability_takes_continuous_checkpoints(tmp_path: Path, runner) -> None:
    train(_continuous(iterations=4), tmp_path / "c")
    out = runner.invoke(app, ["stability", "-q", str(tmp_path / "c"), "--triplets", "4", "-o", str(tmp_path / "s.zarr")])
    assert out.exit_code == 0, out.output
    ds = xr.open_zarr(tmp_path / "s.zarr")
    assert set(ds["condition"].values) == {"all/all"}
    scores = ds["score_default"].values
    assert np.isfinite(scores).all() and (np.abs(scores) <= 1 + 1e-9).all()
    bad = runner.invoke(app, ["stability", "-q", str(tmp_path / "c"), "--target-freq", "rare", "-o",
                              str(tmp_path / "t.zarr")])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_summarize_reads_cosine_stores(tmp_path: Path) -> None:
    """Seeds as trials for the continuous task: the mean over seeds of each store's cosine similarity
    (and per position), with a CI that brackets it."""
    import dataclasses

    import gradscope
    from gradscope.store import write_store

    stores = []
    for seed in (3, 4):
        cfg = _continuous(iterations=4)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed, checkpoint_every=4))
        train(cfg, tmp_path / f"r{seed}")
        write_store(gradscope.accuracy(tmp_path / f"r{seed}", resamples=100), tmp_path / f"a{seed}.zarr")
        stores.append(tmp_path / f"a{seed}.zarr")
    per_seed = [xr.open_zarr(p) for p in stores]
    summary = gradscope.summarize([str(p) for p in stores])
    assert list(summary["metric"].values) == ["cosine_similarity", "cosine/t4", "cosine/t5", "cosine/t6"]
    mean = summary["mean"].sel(metric="cosine_similarity").item()
    assert mean == pytest.approx(np.mean([float(ds["cosine_similarity"][-1]) for ds in per_seed]), abs=1e-12)
    t5 = summary["mean"].sel(metric="cosine/t5").item()
    assert t5 == pytest.approx(np.mean([float(ds["position_cosine"].sel(time=5)[-1]) for ds in per_seed]), abs=1e-12)
    assert summary["low"].sel(metric="cosine_similarity").item() <= mean <= summary["high"].sel(metric="cosine_similarity").item()


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


def test_dynamics_on_a_continuous_checkpoint(tmp_path: Path, runner) -> None:
    """dynamics reads a vector task's checkpoint as stability does (ids into the seeded table of
    sphere points): every step is a 'point' or the 'query', the flow is finite, the CLI table names
    the class, and a Loaded checkpoint gives what its path gives."""
    import gradscope

    train(_continuous(iterations=4), tmp_path / "c")
    r = runner.invoke(app, ["dynamics", str(tmp_path / "c"), "--sequences", "2", "--steps", "20", "--trajectories",
                            "1", "-q", "-o", str(tmp_path / "d.zarr")])
    assert r.exit_code == 0, r.output
    assert "step radius" in r.stdout and "(point)" in r.stdout
    ds = xr.open_zarr(tmp_path / "d.zarr")
    assert set(np.asarray(ds["token_class"].values).ravel()) == {"point", "query"}
    assert np.isfinite(ds["flow_fro"].values).all()
    opts = dict(sequences=2, steps=20, trajectories=1, parts="flow,lyapunov")
    by_path = gradscope.dynamics(tmp_path / "c", **opts)
    by_loaded = gradscope.dynamics(gradscope.load(tmp_path / "c"), **opts)
    np.testing.assert_array_equal(by_loaded["flow_fro"].values, by_path["flow_fro"].values[-1:])
