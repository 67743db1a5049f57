"""The dynamics store: gradient flow, the (t, T) grid, step spectra, Lyapunov spectra and gate
terms over checkpoints (docs/definitions.md §7; layout in docs/stores.md)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from gradscope.files.io import sha256_file
from gradscope.store.io import provenance


@dataclass(frozen=True)
class DynamicsResult:
    """One checkpoint's dynamics; every array is numpy on the CPU (float64 unless stated).

    flow_fro / flow_spectral (n, T): ‖∂y_T/∂z_k‖ per probe sequence and step k = 1 … T;
    grid (g, T, T): ‖∂z_T/∂z_t‖_F for t ≤ T (NaN below the diagonal) on the first g sequences;
    radius (n, T): ρ(J_t); singular (n, T, k): top singular values of J_t;
    lyapunov (m, k): exponents per trajectory (natural log per step, descending; −inf exact; k = D
    unless a partial spectrum was chosen); lyapunov_below_resolution (m, k) int: 1 where the value is
    an upper bound below the QR's resolution;
    lyapunov_running (c, D): the estimate after ``lyapunov_steps`` steps (mean over trajectories);
    error bars (:mod:`gradscope.analysis.lyapunov`): lyapunov_se_batch (m, k) batch-means standard
    error per trajectory; lyapunov_se_trajectories (k,) standard error of the mean over trajectories;
    lyapunov_drift (m, k) second-half − first-half mean; lyapunov_unconverged (m, k) int: 1 where the
    drift exceeds its error; lyapunov_running_se (c, k) standard error over trajectories of the running
    estimate. Stores written before these existed lack them (readers check).
    gates (n, T, G): ‖term‖_F of each gate term of J_t; blocks: static (spectral norm, radius)
    of each gate's block of W_hh. Estimated parts (matrix-free, :mod:`gradscope.analysis.estimators`)
    carry their error beside them: flow_fro_se and grid_se (standard errors; an estimated flow has no
    flow_spectral), singular_bound (Ritz bound), gates_se.
    """

    path: Path
    iteration: int
    run: str
    parts: dict[str, np.ndarray] = field(default_factory=dict)
    blocks: dict[str, tuple[float, float]] = field(default_factory=dict)


def _strings(values: Any) -> np.ndarray:
    return np.asarray(list(values), dtype=object)


def dynamics_dataset(results: list[DynamicsResult], *, tokens: np.ndarray, token_class: np.ndarray,
                     condition: np.ndarray, gate_names: tuple[str, ...], lyapunov_steps: np.ndarray | None,
                     options: dict[str, Any], config: dict[str, Any], command: str, device: str) -> xr.Dataset:
    """Dims: checkpoint, sequence (probe sequences), step (1 … T), grid_sequence, t, T (the grid),
    sv, trajectory, exponent (D of them), lyap_step, gate, block."""
    first = results[0].parts
    stack = lambda name: np.stack([r.parts[name] for r in results])  # noqa: E731
    data: dict[str, Any] = {}
    if "flow_fro" in first:
        data["flow_fro"] = (("checkpoint", "sequence", "step"), stack("flow_fro"))
        if "flow_spectral" in first:  # exact runs; the matrix-free estimate has the Frobenius norm only
            data["flow_spectral"] = (("checkpoint", "sequence", "step"), stack("flow_spectral"))
        if "flow_fro_se" in first:  # estimated matrix-free: its standard error beside each value
            data["flow_fro_se"] = (("checkpoint", "sequence", "step"), stack("flow_fro_se"))
    if "grid" in first:
        data["tT_grid"] = (("checkpoint", "grid_sequence", "t", "T"), stack("grid"))
        if "grid_se" in first:  # estimated matrix-free: its standard error beside each value
            data["tT_grid_se"] = (("checkpoint", "grid_sequence", "t", "T"), stack("grid_se"))
    if "radius" in first:
        data["step_radius"] = (("checkpoint", "sequence", "step"), stack("radius"))
        data["step_sv"] = (("checkpoint", "sequence", "step", "sv"), stack("singular"))
        if "singular_bound" in first:  # estimated: each value lies within this of a singular value
            data["step_sv_bound"] = (("checkpoint", "sequence", "step", "sv"), stack("singular_bound"))
    if "lyapunov" in first:
        data["lyapunov"] = (("checkpoint", "trajectory", "exponent"), stack("lyapunov"))
        if "lyapunov_below_resolution" in first:  # 1: the value is an upper bound below the QR's resolution
            data["lyapunov_below_resolution"] = (("checkpoint", "trajectory", "exponent"),
                                                 stack("lyapunov_below_resolution"))
        data["lyapunov_running"] = (("checkpoint", "lyap_step", "exponent"), stack("lyapunov_running"))
        per_trajectory = ("trajectory", "exponent")
        for name, dims in (("lyapunov_se_batch", per_trajectory), ("lyapunov_drift", per_trajectory),
                           ("lyapunov_unconverged", per_trajectory), ("lyapunov_se_trajectories", ("exponent",)),
                           ("lyapunov_running_se", ("lyap_step", "exponent"))):
            if name in first:
                data[name] = (("checkpoint", *dims), stack(name))
    if "gates" in first:
        data["gate_norm"] = (("checkpoint", "sequence", "step", "gate"), stack("gates"))
        if "gates_se" in first:
            data["gate_norm_se"] = (("checkpoint", "sequence", "step", "gate"), stack("gates_se"))
    if results[0].blocks:
        names = list(results[0].blocks)
        data["block_norm"] = (("checkpoint", "block"), np.array([[r.blocks[b][0] for b in names] for r in results]))
        data["block_radius"] = (("checkpoint", "block"), np.array([[r.blocks[b][1] for b in names] for r in results]))
    checkpoints = [{"path": str(r.path), "iteration": r.iteration, "run": r.run,
                    "sha256": sha256_file(r.path) if r.path.is_file() else ""} for r in results]
    n, T = tokens.shape
    coords: dict[str, Any] = {
        "checkpoint": np.arange(len(results)),
        "iteration": ("checkpoint", np.array([r.iteration for r in results])),
        "checkpoint_path": ("checkpoint", _strings(c["path"] for c in checkpoints)),
        "run": ("checkpoint", _strings(r.run for r in results)),
        "sequence": np.arange(n), "step": np.arange(1, T + 1),
        "tokens": (("sequence", "step"), tokens),
        "token_class": (("sequence", "step"), _strings(token_class.ravel()).reshape(token_class.shape)),
        "condition": ("sequence", _strings(condition)),
    }
    if "tT_grid" in data:
        g = data["tT_grid"][1].shape[1]
        coords.update({"grid_sequence": np.arange(g), "t": np.arange(1, T + 1), "T": np.arange(1, T + 1)})
    if "step_sv" in data:
        coords["sv"] = np.arange(data["step_sv"][1].shape[-1])
    if "lyapunov" in data:
        m, D = data["lyapunov"][1].shape[1:]
        coords.update({"trajectory": np.arange(m), "exponent": np.arange(1, D + 1)})
        coords["lyap_step"] = lyapunov_steps
    if "gate_norm" in data:
        coords["gate"] = _strings(gate_names)
    if "block_norm" in data:
        coords["block"] = _strings(results[0].blocks)
    attrs = provenance("dynamics", command, device, {
        **config, "checkpoints": checkpoints, "options": options,
        "definitions": "docs/definitions.md §7: flow = |d y_T / d z_k| (Frobenius, spectral); tT_grid = |d z_T / d z_t|_F; "
                       "step spectra of J_t = d z_t / d z_(t-1); lyapunov: Benettin/QR, natural log per step, "
                       "descending; gate_norm = |term|_F of each path through the cell",
    })
    return xr.Dataset(data, coords=coords, attrs=attrs)


# ---------------------------------------------------------------------------------------------
# What the report draws from dynamics stores (reports read data through here only)

CLASSES = ("frequent", "rare", "query")


def _t_interval(values: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Mean and 95% Student-t interval along ``axis`` (NaN-free input): (mean, low, high, n)."""
    from scipy import stats  # on first use (reports): not every command needs scipy.stats

    n = values.shape[axis]
    mean = values.mean(axis)
    if n < 2:
        return mean, mean * np.nan, mean * np.nan, n
    half = stats.t.ppf(0.975, n - 1) * values.std(axis, ddof=1) / np.sqrt(n)
    return mean, mean - half, mean + half, n


@dataclass(frozen=True)
class FlowCurve:
    """log10 ‖∂y_T/∂z_k‖_F against the distance T − k for steps k reading one token class: mean and
    95% t-interval over the probe sequences of one checkpoint."""

    label: str
    iteration: int
    token_class: str
    distance: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: int


def flow_curves(items: list[Any]) -> list[FlowCurve]:
    """Per dynamics store (``Input``), checkpoint and token class of the step read."""
    out = []
    for item in items:
        ds = item.ds
        if "flow_fro" not in ds:
            continue
        T = ds.sizes["step"]
        cls = ds["token_class"].values  # (n, T)
        for c in range(ds.sizes["checkpoint"]):
            logs = np.log10(np.maximum(ds["flow_fro"].values[c], 1e-300))  # (n, T)
            for k in CLASSES:
                steps = [s for s in range(T) if (cls[:, s] == k).any()]
                if not steps:
                    continue
                rows = [logs[cls[:, s] == k, s] for s in steps]
                stats_ = [_t_interval(r) for r in rows]
                out.append(FlowCurve(item.label, int(ds["iteration"][c]), k, T - 1 - np.array(steps),
                                     np.array([s[0] for s in stats_]), np.array([s[1] for s in stats_]),
                                     np.array([s[2] for s in stats_]), int(min(s[3] for s in stats_))))
    return out


def grid_means(items: list[Any]) -> list[tuple[str, int, np.ndarray]]:
    """(label, iteration, mean log10 ‖∂z_T/∂z_t‖_F (t, T)) per dynamics store and checkpoint."""
    out = []
    for item in items:
        if "tT_grid" not in item.ds:
            continue
        grid = item.ds["tT_grid"].values  # (c, g, t, T)
        with np.errstate(divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # t > T holds NaN in every sequence
            logs = np.log10(grid)
            for c in range(grid.shape[0]):
                out.append((item.label, int(item.ds["iteration"][c]), np.nanmean(logs[c], axis=0)))
    return out


def radius_samples(items: list[Any]) -> dict[str, dict[int, dict[str, np.ndarray]]]:
    """label → iteration → token class → spectral radii ρ(J_t) of the steps reading that class."""
    out: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for item in items:
        if "step_radius" not in item.ds:
            continue
        cls = item.ds["token_class"].values
        for c in range(item.ds.sizes["checkpoint"]):
            r = item.ds["step_radius"].values[c]
            out.setdefault(item.label, {})[int(item.ds["iteration"][c])] = {k: r[cls == k] for k in CLASSES
                                                                              if (cls == k).any()}
    return out


def resolved_exponents(ds: xr.Dataset, c: int) -> np.ndarray:
    """The exponents (m, k) of checkpoint c with −inf and below-resolution values (upper bounds) as NaN:
    what means and intervals may average."""
    lam = ds["lyapunov"].values[c].astype(float)
    low = ds["lyapunov_below_resolution"].values[c].astype(bool) if "lyapunov_below_resolution" in ds else False
    return np.where(np.isfinite(lam) & ~low, lam, np.nan)


def _nan_t_interval(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`_t_interval` over axis 0 of values with NaN (unresolved) entries left out per column;
    n: the fewest values any column had."""
    from scipy import stats  # on first use (reports): not every command needs scipy.stats

    counts = np.isfinite(values).sum(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns stay NaN
        mean = np.nanmean(values, 0)
        sd = np.nanstd(values, 0, ddof=1)
    half = np.where(counts >= 2, stats.t.ppf(0.975, np.maximum(counts - 1, 1)) * sd / np.sqrt(np.maximum(counts, 1)),
                    np.nan)
    return mean, mean - half, mean + half, int(counts.min()) if counts.size else 0


def lyapunov_spectra(items: list[Any]) -> list[tuple[str, int, tuple[np.ndarray, np.ndarray, np.ndarray, int]]]:
    """(label, iteration, (mean, low, high, n)) of the exponents over trajectories, per checkpoint;
    −inf and below-resolution exponents are counted out, never averaged in."""
    return [(item.label, int(item.ds["iteration"][c]), _nan_t_interval(resolved_exponents(item.ds, c)))
            for item in items if "lyapunov" in item.ds for c in range(item.ds.sizes["checkpoint"])]


def lyapunov_convergence(items: list[Any]) -> list[tuple[str, int, np.ndarray, np.ndarray]]:
    """(label, iteration, steps, running estimate (steps, D)) per checkpoint: mean over trajectories."""
    return [(item.label, int(item.ds["iteration"][c]), item.ds["lyap_step"].values,
             item.ds["lyapunov_running"].values[c])
            for item in items if "lyapunov_running" in item.ds for c in range(item.ds.sizes["checkpoint"])]


def batch_se_of_mean(ds: xr.Dataset, c: int) -> np.ndarray | None:
    """(k,) batch-means standard error of the mean over trajectories of checkpoint c: the
    trajectories' own errors combined, sqrt(Σ se²) / m over the resolved exponents (NaN where none
    is); None for a store written before the error bars."""
    if "lyapunov_se_batch" not in ds:
        return None
    se = np.where(np.isfinite(resolved_exponents(ds, c)), ds["lyapunov_se_batch"].values[c], np.nan)
    counts = np.isfinite(se).sum(0)
    return np.where(counts > 0, np.sqrt(np.nansum(se ** 2, 0)) / np.maximum(counts, 1), np.nan)


def lyapunov_error_bars(items: list[Any]) -> list[tuple[str, int, np.ndarray | None, np.ndarray | None]]:
    """(label, iteration, :func:`batch_se_of_mean` (k,), standard error over trajectories of the running
    estimate (steps, k)) per checkpoint; None where the store predates the error bars."""
    return [(item.label, int(item.ds["iteration"][c]), batch_se_of_mean(item.ds, c),
             item.ds["lyapunov_running_se"].values[c] if "lyapunov_running_se" in item.ds else None)
            for item in items if "lyapunov" in item.ds for c in range(item.ds.sizes["checkpoint"])]


def gate_means(items: list[Any]) -> list[tuple[str, int, str, dict[str, float]]]:
    """(label, iteration, token class, gate → mean ‖term‖_F over the steps reading that class)."""
    out = []
    for item in items:
        if "gate_norm" not in item.ds:
            continue
        cls = item.ds["token_class"].values
        gates = [str(g) for g in item.ds["gate"].values]
        for c in range(item.ds.sizes["checkpoint"]):
            g = item.ds["gate_norm"].values[c]  # (n, T, G)
            for k in CLASSES:
                mask = cls == k
                if mask.any():
                    out.append((item.label, int(item.ds["iteration"][c]), k,
                                {name: float(g[mask][:, i].mean()) for i, name in enumerate(gates)}))
    return out
