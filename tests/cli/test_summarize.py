"""`gradscope summarize` end to end (SPEC §5): seeds to a table of intervals (a bootstrap over trials, or
tokens pooled with a t-interval), stability stores, one-line errors, and a one-trial group without a CI."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from scipy import stats
from typer.testing import CliRunner

import gradscope
from tests.helpers.runs import small_run
from gradscope.store import read_store, write_store
from gradscope.train import train

from tests.cli.test_accuracy import _run


@pytest.fixture(scope="module")
def seed_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Three seeds each of a vanilla and a PE GRU, and one run of another task."""
    base = tmp_path_factory.mktemp("seeds")
    runs: dict[str, list[Path]] = {"none": [], "sinusoidal": []}
    for pe in runs:
        for seed in (1, 2, 3):
            cfg = small_run(pe=pe, iterations=10)
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed))
            train(cfg, base / f"{pe}-{seed}")
            runs[pe].append(base / f"{pe}-{seed}")
    sort = small_run(iterations=5, name="sort", distribution="uniform")
    train(sort, base / "sort")
    runs["sort"] = [base / "sort"]
    return runs


def _accuracy_stores(runner: CliRunner, runs: list[Path], tmp_path: Path) -> list[Path]:
    stores = []
    for run in runs:
        out = tmp_path / f"acc-{run.name}.zarr"
        assert _run(runner, "accuracy", run, "-o", out, "-q").exit_code == 0
        stores.append(out)
    return stores


def test_three_seeds_to_a_ci_table(runner: CliRunner, seed_runs: dict, tmp_path: Path) -> None:
    stores = _accuracy_stores(runner, seed_runs["none"] + seed_runs["sinusoidal"], tmp_path)
    out, csv = tmp_path / "sum.zarr", tmp_path / "sum.csv"
    result = _run(runner, "summarize", *stores, "--compare", "pe", "-o", out, "--csv", csv, "--resamples", "2000")
    assert result.exit_code == 0, result.stderr
    assert "pe=sinusoidal" in result.stdout and "fewer than 10 trials" in result.stdout
    assert "paired permutation test" in result.stdout and "all 8 rearrangements" in result.stdout
    ds = read_store(out, kind="summary")
    g = int(np.flatnonzero(ds["pe"].values == "none")[0])
    per_seed = np.array([float(read_store(s)["token_accuracy"][-1]) for s in stores[:3]])
    np.testing.assert_allclose(ds["values"].sel(metric="token_accuracy").values[g], per_seed)
    ref = stats.bootstrap((per_seed,), np.mean, n_resamples=2000, method="percentile", vectorized=True,
                          rng=np.random.default_rng(0)).confidence_interval
    assert float(ds["low"].sel(metric="token_accuracy")[g]) == pytest.approx(ref.low)
    assert float(ds["high"].sel(metric="token_accuracy")[g]) == pytest.approx(ref.high)
    assert ds["seed"].values[g].tolist() == [1, 2, 3]
    assert csv.read_text().startswith("group,metric,mean,low,high,n,nan,nan_units,per_seed,note")
    # the same command again gives the same numbers
    again = tmp_path / "again.zarr"
    assert _run(runner, "summarize", *stores, "-o", again, "--resamples", "2000").exit_code == 0
    # bit for bit: the same process, code path and seeded bootstrap
    np.testing.assert_array_equal(read_store(again)["low"].values, ds["low"].values)
    # the few-trials note advises --interval t: with it, there is nothing to advise (found in review)
    t = _run(runner, "summarize", *stores, "--interval", "t", "-o", tmp_path / "t.zarr", "--resamples", "200")
    assert t.exit_code == 0 and "fewer than 10 trials" not in t.stdout and "CI, t, unit = trial" in t.stdout


def test_token_unit_and_t_method(runner: CliRunner, seed_runs: dict, tmp_path: Path) -> None:
    stores = _accuracy_stores(runner, seed_runs["none"], tmp_path)
    out = tmp_path / "tok.zarr"
    result = _run(runner, "summarize", *stores, "--unit", "token", "--interval", "t", "-o", out, "--resamples", "500")
    assert result.exit_code == 0, result.stderr
    ds = read_store(out)
    pooled_right = sum(int(read_store(s)["sequence_correct"][-1].sum()) for s in stores)
    pooled_total = sum(int(read_store(s)["sequence_scored"].sum()) for s in stores)
    assert float(ds["mean"].sel(metric="token_accuracy")[0]) == pytest.approx(pooled_right / pooled_total)
    assert int(ds["n"].sel(metric="token_accuracy")[0]) == pooled_total
    api = gradscope.summarize([str(s) for s in stores], unit="token", interval="t", resamples=500)
    assert api.attrs["method"] == "t"  # the store's attribute keeps its name


def test_summarize_stability_stores(runner: CliRunner, seed_runs: dict, tmp_path: Path) -> None:
    stores = []
    for run in seed_runs["none"]:
        out = tmp_path / f"st-{run.name}.zarr"
        assert _run(runner, "stability", run, "-o", out, "-q", "--triplets", "3", "--resamples", "100").exit_code == 0
        stores.append(out)
    result = _run(runner, "summarize", *stores, "-o", tmp_path / "s.zarr", "--resamples", "500")
    assert result.exit_code == 0, result.stderr
    assert "stability/same-target/rare/rare" in result.stdout
    ds = read_store(tmp_path / "s.zarr")
    first = read_store(stores[0])
    mask = first["condition"].values == "rare/rare"
    expected = float(np.nanmean(first["score_default"].sel(pair="same-target").values[-1][mask]))
    assert float(ds["values"].sel(metric="stability/same-target/rare/rare")[0, 0]) == pytest.approx(expected)


def test_summarize_errors(runner: CliRunner, seed_runs: dict, tmp_path: Path) -> None:
    stores = _accuracy_stores(runner, [seed_runs["none"][0], seed_runs["sort"][0]], tmp_path)
    mixed = _run(runner, "summarize", *stores, "-o", tmp_path / "x.zarr")
    assert mixed.exit_code == 2 and "different tasks" in mixed.stderr and "--by" in mixed.stderr
    assert _run(runner, "summarize", *stores, "--by", "task,model", "-o", tmp_path / "x.zarr").exit_code == 0
    empty = _run(runner, "summarize", str(tmp_path / "nothing-*.zarr"))
    assert empty.exit_code == 2 and "matches nothing" in empty.stderr
    write_store(xr.Dataset(attrs={"kind": "accuracy", "model_config": "{}", "task_config": "{}",
                                  "train_config": "{}"}), tmp_path / "hollow.zarr")
    hollow = _run(runner, "summarize", tmp_path / "hollow.zarr")
    assert hollow.exit_code == 2 and "lacks" in hollow.stderr
    dup = _run(runner, "summarize", stores[0], stores[0])
    assert dup.exit_code == 2 and "several stores for seed" in dup.stderr
    bad = _run(runner, "summarize", stores[0], "--by", "colour")
    assert bad.exit_code == 2 and "--by: got 'colour'" in bad.stderr
    for result in (mixed, empty, hollow, dup, bad):
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_one_trial_group_says_it_has_no_ci() -> None:
    """One trial has no interval: the table says so instead of printing "[nan, nan]" (issue #24)."""
    from rich.console import Console
    from gradscope.analysis.bootstrap import Interval
    from gradscope.cli.summarize import summary_table
    from gradscope.store.records import SummaryEntry
    entry = SummaryEntry(("gru",), "GRU vanilla", "token_accuracy", Interval(0.75, math.nan, math.nan, 1, 0), (1,), (0.75,))
    console = Console(width=200, record=True)
    console.print(summary_table([entry], 0.95, "percentile", "trial"))
    text = console.export_text()
    assert "0.75" in text and "[no CI]" in text and "nan" not in text.lower()
