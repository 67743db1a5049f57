"""`gradscope summarize --checkpoints all --compare pe`: two arms over seeds and training checkpoints.

The stores are real stability stores of one small run, re-labelled as two arms × four seeds with
scores set by hand, so every expected number is known: the per-checkpoint differences, their
seed-level intervals (Student t, from scipy) and the test's verdict.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

import gradscope
from gradscope.analysis.trend import trend_test
from gradscope.cli.app import app
from gradscope.store import read_store, write_store
from gradscope.train import train
from tests.helpers.runs import small_run

SEEDS = (1, 2, 3, 4)
# the gap b − a per seed at the three checkpoints (10, 20, 30): it opens for every seed
GAPS = {1: (-0.02, 0.05, 0.12), 2: (0.01, 0.08, 0.15), 3: (0.0, 0.04, 0.10), 4: (-0.01, 0.06, 0.20)}


@pytest.fixture(scope="module")
def arms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Stability stores of arms none and sinusoidal, seeds 1–4, three checkpoints: arm a scores 0.5 on
    every triplet, arm b 0.5 + GAPS[seed][checkpoint] (rare/rare triplets; others as arm a)."""
    base = tmp_path_factory.mktemp("arms")
    cfg = small_run(iterations=30)
    cfg = type(cfg)(model=cfg.model, task=cfg.task, train=type(cfg.train)(**{**cfg.train.__dict__,
                                                                              "checkpoint_every": 10}))
    train(cfg, base / "run")
    template = base / "template.zarr"
    result = CliRunner().invoke(app, ["stability", str(base / "run"), "-o", str(template), "-q", "--triplets", "2",
                                      "--resamples", "20"])
    assert result.exit_code == 0, result.stderr
    ds = read_store(template)
    assert ds["iteration"].values.tolist() == [10, 20, 30]
    rare = ds["condition"].values == "rare/rare"
    out: dict[str, list[Path]] = {"none": [], "sinusoidal": []}
    for pe in out:
        for seed in SEEDS:
            copy = ds.copy(deep=True)
            model, training = json.loads(copy.attrs["model_config"]), json.loads(copy.attrs["train_config"])
            model["pe"], training["seed"] = pe, seed
            copy.attrs["model_config"], copy.attrs["train_config"] = json.dumps(model), json.dumps(training)
            scores = np.full(copy["score_default"].shape, 0.5)  # (checkpoint, pair, triplet)
            if pe == "sinusoidal":
                for k, gap in enumerate(GAPS[seed]):
                    scores[k][:, rare] += gap
            copy["score_default"] = (copy["score_default"].dims, scores)
            path = base / f"st-{pe}-{seed}.zarr"
            write_store(copy, path)
            out[pe].append(path)
    return out


def _stores(arms: dict[str, list[Path]]) -> list[str]:
    return [str(p) for pe in ("none", "sinusoidal") for p in arms[pe]]


def test_differences_and_test_over_training(arms: dict[str, list[Path]]) -> None:
    ds = gradscope.summarize(_stores(arms), checkpoints="all", compare="pe", interval="t", resamples=500)
    metric = "stability/same-target/rare/rare"
    assert ds["iteration"].values.tolist() == [10, 20, 30]
    assert ds.attrs["compare"] == "pe" and ds["arm_a"].values.tolist() == ["none"]
    assert ds["arm_b"].values.tolist() == ["sinusoidal"]
    sel = ds.sel(contrast_metric=metric).isel(contrast=0)
    for k in range(3):
        gaps = np.array([GAPS[s][k] for s in SEEDS])
        half = stats.t.ppf(0.975, len(SEEDS) - 1) * gaps.std(ddof=1) / math.sqrt(len(SEEDS))
        assert float(sel["diff_mean"][k]) == pytest.approx(gaps.mean(), abs=1e-12)
        assert float(sel["diff_low"][k]) == pytest.approx(gaps.mean() - half, abs=1e-12)
        assert float(sel["diff_high"][k]) == pytest.approx(gaps.mean() + half, abs=1e-12)
        assert int(sel["diff_n"][k]) == len(SEEDS)
        np.testing.assert_allclose(sel["diff_values"][k].values, gaps, atol=1e-12)
    expected = trend_test(np.array([GAPS[s][0] for s in SEEDS]), np.array([GAPS[s][2] for s in SEEDS]),
                          resamples=500)
    assert str(sel["verdict"].values) == expected.verdict == "opens"
    assert float(sel["gap_mean"]) == pytest.approx(expected.gap.t.mean, abs=1e-12)
    assert float(sel["change_low"]) == pytest.approx(expected.change.t.low, abs=1e-12)
    assert float(sel["change_p"]) == pytest.approx(expected.change.t_p, rel=1e-9)
    assert (int(sel["test_first"]), int(sel["test_last"])) == (10, 30)
    # a condition where the arms are equal: no difference at any checkpoint
    flat = ds.sel(contrast_metric="stability/same-target/frequent/frequent").isel(contrast=0)
    np.testing.assert_array_equal(flat["diff_mean"].values, np.zeros(3))
    # the main table is unchanged: each store's last checkpoint
    last = gradscope.summarize(_stores(arms), interval="t", resamples=500)
    np.testing.assert_array_equal(last["mean"].values, ds["mean"].values)


def test_cli_prints_the_tables_and_writes_the_store(arms: dict[str, list[Path]], tmp_path: Path) -> None:
    out = tmp_path / "sum.zarr"
    result = CliRunner().invoke(app, ["summarize", *_stores(arms), "--checkpoints", "all", "--compare", "pe",
                                      "--interval", "t", "--metric", "stability/same-target/rare/rare",
                                      "--resamples", "500", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "over training" in text and "the gap opens" in text and "iterations 10 → 30" in text
    ds = read_store(out, kind="summary")  # the schema checks the comparison's variables
    assert f"{float(ds['gap_mean'][0, 0]):+.3f} [{float(ds['gap_low'][0, 0]):.3f}" in text
    assert ds["contrast_metric"].values.tolist() == ["stability/same-target/rare/rare"]
    assert str(ds["verdict"].values[0, 0]) == "opens"


def test_a_missing_seed_and_an_unfinished_run(arms: dict[str, list[Path]], tmp_path: Path) -> None:
    """Seed 4's PE store lacks the last checkpoint (an unfinished run): the test runs on the checkpoints
    every seed pair has, and says so; seed 3 without its PE store leaves the pairs."""
    ds = read_store(arms["sinusoidal"][3])
    short = tmp_path / "short.zarr"
    write_store(ds.isel(checkpoint=slice(0, 2)), short)
    stores = [*map(str, arms["none"]), *map(str, arms["sinusoidal"][:2]), str(short)]
    res = gradscope.summarize(stores, checkpoints="all", compare="pe", interval="t", resamples=200,
                              metric=("stability/same-target/rare/rare",))
    sel = res.isel(contrast=0, contrast_metric=0)
    assert sel["diff_n"].values.tolist() == [3, 3, 2]
    assert (int(sel["test_first"]), int(sel["test_last"])) == (10, 20)
    assert "go on to 30" in str(sel["test_note"].values)


def test_options_refused(arms: dict[str, list[Path]]) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["summarize", *_stores(arms), "--checkpoints", "some"])
    assert bad.exit_code == 2 and "checkpoints" in bad.stderr and "last, all" in bad.stderr
    neg = runner.invoke(app, ["summarize", *_stores(arms), "--compare", "pe", "--margin", "-1"])
    assert neg.exit_code == 2 and "margin" in neg.stderr
    lone = runner.invoke(app, ["summarize", *_stores(arms), "--margin", "0.1"])
    assert lone.exit_code == 2 and "--margin" in lone.stderr and "--compare" in lone.stderr
