"""The continuous task's family (paper App. B.3) through the commands: training and resume, its own
accuracy store (cosine similarity per position, against a hand computation), one-line errors, and
stability, summarize and dynamics on its checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from tests.helpers.runs import DEFAULT_CORE
from gradscope.cli.app import app
from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.files.checkpoint import load
from gradscope.train import train


def _continuous(dim: int = 4, pe: str = "none", iterations: int = 30) -> RunConfig:
    task = TaskConfig(name="reverse-continuous", dim=dim, length=3, heldout_size=32)
    return RunConfig(model=ModelConfig(core=DEFAULT_CORE, vocab_size=dim, embed_size=8, hidden_size=16, pe=pe, max_len=8,
                                       inputs="vectors"),
                     task=task, train=TrainConfig(iterations=iterations, batch_size=32, lr=1e-2, warmup=2,
                                                  checkpoint_every=15, log_every=5, seed=3))


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
