"""Wiring: the accuracy store's numbers and `summarize --compare`'s numbers (SPEC §5), checked as
numbers against computations written here: a hand-made predictor, a Damerau–Levenshtein distance
written out (unrestricted, Lowrance–Wagner), and scipy / an enumeration of sign flips."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from scipy import stats
from typer.testing import CliRunner

import gradscope
from tests.helpers.runs import small_run
from gradscope.cli.app import app
from gradscope.store import read_store, write_store
from gradscope.train import train
from gradscope.workflows.families import tokens as token_evaluation  # the default evaluation (issue #39)

from tests.analysis.test_stats import brute_dl

IGNORE = -100


damerau_levenshtein = brute_dl  # the textbook algorithm, written out in test_stats.py


def test_the_reference_distance_itself() -> None:
    assert damerau_levenshtein([1, 2], [2, 1]) == 1  # one transposition
    assert damerau_levenshtein([3, 1], [1, 2, 3]) == 2  # "ca" → "abc": unrestricted 2 (OSA says 3)
    assert damerau_levenshtein([1, 2, 3], [1, 2, 3]) == 0 and damerau_levenshtein([], [4, 4]) == 2


def _scored_rows(preds: torch.Tensor, targets: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
    keep = targets != IGNORE
    return ([p[k].tolist() for p, k in zip(preds, keep)], [t[k].tolist() for t, k in zip(targets, keep)])


def _check_store_against(ds: xr.Dataset, index: int, preds: torch.Tensor, targets: torch.Tensor) -> None:
    """Checkpoint ``index`` of an accuracy store against predictions and targets (n, T) computed here."""
    pred_rows, target_rows = _scored_rows(preds, targets)
    dl = np.array([damerau_levenshtein(p, t) for p, t in zip(pred_rows, target_rows)])
    last = ds.isel(checkpoint=index)
    np.testing.assert_array_equal(last["sequence_dl"].values, dl)
    assert float(last["dl_distance"]) == pytest.approx(dl.mean(), abs=1e-12)
    scored = targets != IGNORE
    right = (preds == targets) & scored
    assert float(last["token_accuracy"]) == pytest.approx(float(right.sum() / scored.sum()), abs=1e-12)
    assert float(last["sequence_accuracy"]) == pytest.approx(float((right == scored).all(1).double().mean()))
    times = torch.nonzero(scored.any(0)).flatten()  # 0-based time steps that hold targets
    assert ds["time"].values.tolist() == (times + 1).tolist()  # stored 1-based
    per_time = (right.sum(0).double() / scored.sum(0).double())[times]
    np.testing.assert_allclose(last["position_accuracy"].values, per_time.numpy(), atol=1e-7)


def test_accuracy_store_against_a_hand_made_predictor(runner: CliRunner, trained_runs: dict, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Reversal with planted errors: the first two outputs transposed (DL 1 where they differ),
    and the last output wrong on every other row (DL +1). So accuracy falls at the start of the
    output phase and at its end, differently: a store reversed in time shows it."""
    ckpt = trained_runs["uniform"] / "step-0000010.pt"
    task = gradscope.load(ckpt).config.task
    length, vocab = task.length, task.vocab_size

    def planted(model: object, inputs: torch.Tensor, chunk: int = 0) -> torch.Tensor:
        preds = inputs.clone()
        out = inputs[:, :length].flip(1).clone()  # the right answer, x_L … x_1
        out[:, [0, 1]] = out[:, [1, 0]]
        out[::2, -1] = (out[::2, -1] + 1) % vocab
        preds[:, length:] = out
        return preds

    monkeypatch.setattr(token_evaluation, "predict", planted)
    out = tmp_path / "a.zarr"
    result = runner.invoke(app, ["accuracy", str(ckpt), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    ds = read_store(out, kind="accuracy")
    held = gradscope.load(ckpt).heldout.uniform
    preds = planted(None, held.inputs)
    _check_store_against(ds, 0, preds, held.targets)
    # the planted structure itself: a time-reversed store could not match it
    acc = ds["position_accuracy"].values[0]
    assert acc[-1] == pytest.approx(0.5) and acc[2] == 1.0 and acc[0] < 0.5 and acc[0] == acc[1]
    assert 0.5 < float(ds["dl_distance"][0]) < 2.0


def test_accuracy_store_against_the_models_own_predictions(runner: CliRunner, trained_runs: dict,
                                                           tmp_path: Path) -> None:
    """Every checkpoint of a real run: predictions computed here from the loaded model."""
    out = tmp_path / "a.zarr"
    assert runner.invoke(app, ["accuracy", str(trained_runs["dual"]), "-o", str(out), "-q"]).exit_code == 0
    ds = read_store(out, kind="accuracy")
    for index, ckpt in enumerate(sorted(trained_runs["dual"].glob("step-*.pt"))):
        loaded = gradscope.load(ckpt)
        with torch.no_grad():
            preds = loaded.model(loaded.heldout.uniform.inputs).argmax(-1)
        assert int(ds["iteration"][index]) == loaded.iteration
        _check_store_against(ds, index, preds, loaded.heldout.uniform.targets)
    assert float(ds["dl_distance"].max()) > 0  # an untrained-ish model errs: a distance of 0 would be wrong


# --- summarize --compare --------------------------------------------------------------------------

# token accuracy per seed, made by hand: b − a = [0.30, −0.05, 0.20, 0.10] (b = sinusoidal, a = none)
HAND = {"none": [0.50, 0.60, 0.40, 0.70], "sinusoidal": [0.80, 0.55, 0.60, 0.80]}
SEEDS = [1, 2, 3, 4]


@pytest.fixture(scope="module")
def pe_stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Accuracy stores of 4 seeds × (vanilla, PE) from real runs; token_accuracy then replaced by HAND."""
    base = tmp_path_factory.mktemp("compare")
    runner = CliRunner()
    stores: dict[str, list[Path]] = {"none": [], "sinusoidal": []}
    for pe in stores:
        for seed, value in zip(SEEDS, HAND[pe]):
            cfg = small_run(pe=pe, iterations=5)
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed))
            train(cfg, base / f"run-{pe}-{seed}")
            real = base / f"real-{pe}-{seed}.zarr"
            result = runner.invoke(app, ["accuracy", str(base / f"run-{pe}-{seed}"), "-o", str(real), "-q"])
            assert result.exit_code == 0, result.stderr
            ds = read_store(real)
            ds["token_accuracy"].values[-1] = value
            for var in ds.variables.values():
                var.encoding.clear()
            write_store(ds, base / f"acc-{pe}-{seed}.zarr")
            stores[pe].append(base / f"acc-{pe}-{seed}.zarr")
    return stores


def _comparison_row(stdout: str, metric: str) -> list[str]:
    rows = [line for line in stdout.splitlines() if f" {metric} " in line and "→" in line]
    assert len(rows) == 1, stdout
    return [cell.strip() for cell in rows[0].strip().strip("│").split("│")]


def _sign_flip_p(d: np.ndarray) -> float:
    """Exact two-sided p of the paired sign-flip test: the share of the 2^n sign patterns whose |mean| ≥ observed."""
    observed = abs(d.mean())
    flips = [abs((d * np.array(s)).mean()) for s in itertools.product([1, -1], repeat=d.size)]
    return float(np.mean([f >= observed - 1e-12 for f in flips]))


def test_compare_reports_b_minus_a_with_scipys_p_and_d_z(runner: CliRunner, pe_stores: dict,
                                                         tmp_path: Path) -> None:
    result = runner.invoke(app, ["summarize", *map(str, pe_stores["none"] + pe_stores["sinusoidal"]),
                                 "--compare", "pe", "--resamples", "200", "-o", str(tmp_path / "s.zarr")])
    assert result.exit_code == 0, result.stderr
    assert "pe = b − a" in result.stdout
    a, b = np.array(HAND["none"]), np.array(HAND["sinusoidal"])
    d = b - a
    row = _comparison_row(result.stdout, "token_accuracy")
    assert row[2] == "none → sinusoidal" and row[6] == "4"
    # by hand: mean 0.1375, sd (ddof 1) 0.14930, d_z 0.9209; of the 16 sign patterns, 4 reach
    # |sum| ≥ 0.55 (the observed one, all +, and their negatives): p = 0.25
    assert float(row[3]) == pytest.approx(0.1375, abs=5e-5) and row[3].startswith("+")
    assert float(row[4]) == pytest.approx(d.mean() / d.std(ddof=1), abs=5e-4)
    assert float(row[4]) == pytest.approx(0.921, abs=5e-4)
    assert float(row[5]) == pytest.approx(0.25, abs=5e-5)
    ref = stats.permutation_test((b, a), lambda x, y, axis: np.mean(x - y, axis=axis), permutation_type="samples",
                                 alternative="two-sided", vectorized=True, n_resamples=np.inf)
    assert ref.pvalue == pytest.approx(_sign_flip_p(d))
    assert float(row[5]) == pytest.approx(ref.pvalue, abs=5e-5)
    # a metric left as measured: every number from the per-seed store values, against scipy
    xa = np.array([float(read_store(s)["dl_distance"][-1]) for s in pe_stores["none"]])
    xb = np.array([float(read_store(s)["dl_distance"][-1]) for s in pe_stores["sinusoidal"]])
    row = _comparison_row(result.stdout, "dl_distance")
    dd = xb - xa
    assert float(row[3]) == pytest.approx(dd.mean(), abs=5e-5)
    assert float(row[4]) == pytest.approx(dd.mean() / dd.std(ddof=1), abs=5e-4)
    assert float(row[5]) == pytest.approx(_sign_flip_p(dd), abs=5e-5)


def test_bins_are_refused_where_there_is_no_grid_to_bin(tmp_path: Path) -> None:
    """An option either applies or is refused: --bins on a checkpoint without a frequency grid (or with
    --no-grid) was accepted and ignored. The default still bins a grid in quarters, recorded as before."""
    from typer.testing import CliRunner

    from gradscope.cli.app import app
    from gradscope.store import read_store

    runner = CliRunner()
    small = ["--vocab-size", "6", "--length", "4", "--embed-size", "4", "--hidden-size", "6", "--iterations", "2",
             "--heldout-size", "16", "-q"]
    for name, extra in (("uniform", ["--distribution", "uniform"]), ("dual", ["--distribution", "dual", "--grid-per-cell", "2"])):
        done = runner.invoke(app, ["train", *small, *extra, "-o", str(tmp_path / name)])
        assert done.exit_code == 0, done.stderr
    for run, flags, message in (("uniform", ["--bins", "2"], "has no frequency grid to bin"),
                                ("dual", ["--bins", "2", "--no-grid"], "which grid=False (--no-grid) skips")):
        done = runner.invoke(app, ["accuracy", str(tmp_path / run), *flags, "-o", str(tmp_path / "a.zarr"), "-q"])
        assert done.exit_code == 2 and f"bins: " in done.stderr and message in done.stderr, done.stderr
        assert not (tmp_path / "a.zarr").exists()
    done = runner.invoke(app, ["accuracy", str(tmp_path / "dual"), "-o", str(tmp_path / "a.zarr"), "-q"])
    assert done.exit_code == 0
    ds = read_store(tmp_path / "a.zarr")
    assert json.loads(ds.attrs["options"])["bins"] == 4 and ds.sizes["bin"] == 4
    # a grid shorter than 4 positions: the default is one bin per position (it failed: "--bins: got 4")
    done = runner.invoke(app, ["train", *small, "--distribution", "dual", "--grid-per-cell", "2", "--length", "3",
                               "-o", str(tmp_path / "short")])
    assert done.exit_code == 0, done.stderr
    done = runner.invoke(app, ["accuracy", str(tmp_path / "short"), "-o", str(tmp_path / "s.zarr"), "-q"])
    assert done.exit_code == 0, done.stderr
    ds = read_store(tmp_path / "s.zarr")
    assert json.loads(ds.attrs["options"])["bins"] == 3 and ds.sizes["bin"] == 3
