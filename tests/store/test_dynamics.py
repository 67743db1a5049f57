"""The dynamics store's Lyapunov error bars: written by the command, read back for the CLI table and
the report's bands, and a store written before them still read (no bands, "-" in the table)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from gradscope.cli.app import app
from gradscope.store.dynamics import batch_se_of_mean, lyapunov_error_bars


def test_store_table_and_report_carry_the_error_bars_and_old_stores_still_read(trained_runs: dict, runner,
                                                                               tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "d.zarr"
    result = runner.invoke(app, ["dynamics", str(trained_runs["dual"]), "-o", str(out), "--parts", "lyapunov",
                                 "--trajectories", "3", "--steps", "64", "--lyap-warmup", "8", "-q"])
    assert result.exit_code == 0, result.stderr
    ds = xr.open_zarr(out, consolidated=False).load()
    from gradscope.cli.dynamics import dynamics_table

    columns = {str(col.header): list(col._cells) for col in dynamics_table(ds).columns}
    assert "SE of λ_1 (traj / batch)" in columns and "−∞ · below res. · unconv." in columns
    c, m, k = ds["lyapunov"].shape
    assert ds["lyapunov_se_batch"].shape == ds["lyapunov_drift"].shape == ds["lyapunov_unconverged"].shape == (c, m, k)
    assert ds["lyapunov_se_trajectories"].shape == (c, k)
    assert ds["lyapunov_running_se"].shape == ds["lyapunov_running"].shape
    lam = ds["lyapunov"].values
    np.testing.assert_allclose(ds["lyapunov_se_trajectories"].values, lam.std(1, ddof=1) / np.sqrt(m), rtol=1e-9)
    assert np.isfinite(ds["lyapunov_se_batch"].values).all() and (ds["lyapunov_se_batch"].values > 0).all()
    se_cell = columns["SE of λ_1 (traj / batch)"][-1]
    assert se_cell.startswith(f"{ds['lyapunov_se_trajectories'].values[-1, 0]:.2g} / "), se_cell
    item = type("Item", (), {"ds": ds, "label": "gru"})
    bars = lyapunov_error_bars([item])
    assert len(bars) == c and bars[0][2].shape == (k,) and bars[0][3].shape == ds["lyapunov_running"].shape[1:]
    # a store written before the error bars: the table shows "-", the report draws no bands
    old = ds.drop_vars([v for v in ds.data_vars if v.startswith("lyapunov_") and v not in
                        ("lyapunov_running", "lyapunov_below_resolution")])
    old_path = tmp_path / "old.zarr"
    old.to_zarr(old_path, consolidated=False)
    from gradscope.cli.dynamics import lyapunov_cells
    from gradscope.reports.dynamics_figures import lyapunov_figure
    from gradscope.store.dynamics import lyapunov_convergence, lyapunov_spectra

    reread = xr.open_zarr(old_path, consolidated=False).load()
    assert lyapunov_cells(reread, 0)[1] == "-" and batch_se_of_mean(reread, 0) is None
    olds = [type("Item", (), {"ds": reread, "label": "old"})]
    fig = lyapunov_figure(lyapunov_spectra(olds), lyapunov_convergence(olds), None, lyapunov_error_bars(olds))
    assert not [t for t in fig.data if getattr(t, "fill", None) == "toself"]
    news = [item]
    fig = lyapunov_figure(lyapunov_spectra(news), lyapunov_convergence(news), None, lyapunov_error_bars(news))
    assert len([t for t in fig.data if getattr(t, "fill", None) == "toself"]) == c * 3  # spectrum + λ_1 + λ_D
