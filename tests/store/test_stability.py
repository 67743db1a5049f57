"""The stability store: the probes it records are replayed from it, to the same tokens and conditions, and
the same command twice stores the same numbers (SPEC §4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr
from typer.testing import CliRunner

from tests.cli.test_stability import _invoke


def test_probes_can_be_replayed_from_a_store(runner: CliRunner, trained_runs: dict, tmp_path: Path) -> None:
    first, second = tmp_path / "a.zarr", tmp_path / "b.zarr"
    ckpt = trained_runs["dual"] / "step-0000030.pt"
    assert _invoke(runner, ckpt, "--triplets", "4", "--seed", "9", "-o", first).exit_code == 0
    result = _invoke(runner, trained_runs["other"], "--probes", first, "-o", second)
    assert result.exit_code == 0, result.stderr
    a, b = xr.open_zarr(first, consolidated=False), xr.open_zarr(second, consolidated=False)
    assert np.array_equal(a["probe_tokens"].values, b["probe_tokens"].values)
    assert list(a["condition"].values) == list(b["condition"].values)
    # the same command twice gives the same numbers
    third = tmp_path / "c.zarr"
    assert _invoke(runner, ckpt, "--triplets", "4", "--seed", "9", "-o", third).exit_code == 0
    c = xr.open_zarr(third, consolidated=False)
    assert np.array_equal(a["score_default"].values, c["score_default"].values)
