"""Wiring: `summarize --compare`'s numbers (SPEC §5), checked against scipy and an enumeration of sign
flips, and `accuracy --bins` refused where there is no grid to bin. The accuracy store's own numbers are
checked in tests/workflows/families/test_tokens.py."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from tests.helpers.runs import small_run
from gradscope.cli.app import app
from gradscope.store import read_store, write_store
from gradscope.train import train


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
