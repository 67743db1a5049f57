"""`gradscope dynamics`: its table shows NaN as NaN, as a diverged checkpoint's store holds it, and bad
options are one-line errors."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from gradscope.cli.app import app


def _dynamics_ds(lam: np.ndarray, gates: np.ndarray | None = None, flow: np.ndarray | None = None) -> xr.Dataset:
    m, k = lam.shape
    data = {"lyapunov": (("checkpoint", "trajectory", "exponent"), lam[None]),
            "iteration": (("checkpoint",), np.array([5]))}
    cls = np.array([["frequent", "rare", "frequent"]])
    data["token_class"] = (("sequence", "t"), cls)
    if gates is not None:
        data["gate_norm"] = (("checkpoint", "sequence", "t", "gate"), gates[None])
    if flow is not None:
        data["flow_fro"] = (("checkpoint", "sequence", "t"), flow[None])
    coords = {"gate": ["update", "reset"]} if gates is not None else {}
    return xr.Dataset(data, coords=coords)


def test_the_dynamics_table_shows_nan_as_nan() -> None:
    from rich.console import Console

    from gradscope.cli.dynamics import dynamics_table, lyapunov_cells

    nan = np.full((2, 3), np.nan)
    cells = lyapunov_cells(_dynamics_ds(nan), 0)
    assert cells[0] == "nan" and cells[2] == "nan", cells  # λ_1, then its standard errors, then Σλ
    half = np.array([[0.1, -0.2, -0.5], [np.nan, np.nan, np.nan]])
    cells = lyapunov_cells(_dynamics_ds(half), 0)
    assert "nan in 1/2" in cells[0] and "nan in 1/2" in cells[2], cells
    inf = np.full((2, 3), np.inf)
    assert lyapunov_cells(_dynamics_ds(inf), 0)[0] == "+inf"
    gates = np.full((1, 3, 2), np.nan)
    console = Console(width=200, record=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning on stderr either
        console.print(dynamics_table(_dynamics_ds(nan, gates, np.zeros((1, 3)))))
    row = [ln for ln in console.export_text().splitlines() if ln.strip().startswith(("│ 5", "┃ 5")) or " 5 " in ln][-1]
    assert "below res" not in row and "update" not in row and "reset" not in row and "nan" in row, row


def test_bad_input_is_one_line(runner, trained_runs: dict, tmp_path: Path) -> None:
    for args, message in ((["--parts", "flow,magic"], "--parts: got magic"), (["--lyap-warmup", "2000"], "--lyap-warmup: got 2000"),
                          (["--trajectories", "0"], "--trajectories: got 0")):
        result = runner.invoke(app, ["dynamics", str(trained_runs["dual"]), "-o", str(tmp_path / "x.zarr"), *args])
        assert result.exit_code == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
