"""Wiring: a stability store written by `gradscope stability` holds, under each pair's name, the score
of the right two sequences (SPEC §4), and S4D's conjugate-Wirtinger score with the right sign.

The reference is computed here, triplet by triplet, from the probes stored in the store: float64
Jacobians from `state_jacobian` (the torch.func engine, not the one the command used) and the SPEC
formula S = Σ_i⟨g_i^A, g_i^B⟩ / Σ_i‖g_i^A‖‖g_i^B‖ written out, with A = base, B = the partner.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from typer.testing import CliRunner

import gradscope
from tests.helpers.runs import small_run
from gradscope.analysis.jacobian import state_jacobian
from gradscope.cli.app import app
from gradscope.store import read_store
from gradscope.train import train

PARTNER = {"same-target": 1, "same-suffix": 2}  # probe member index of each pair's partner; member 0 = base


def _stability_store(runner: CliRunner, checkpoint: Path, out: Path, position: int) -> xr.Dataset:
    result = runner.invoke(app, ["stability", str(checkpoint), "--triplets", "2", "--target-pos", str(position),
                                 "--resamples", "50", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    return read_store(out, kind="stability")


def _jacobians(checkpoint: Path, tokens: np.ndarray, position: int) -> torch.Tensor:
    """float64 J = ∂h_2L/∂z_p of each member: tokens (n, 3, L) → (n, 3, H, D)."""
    model = gradscope.load(checkpoint).model.double()
    n, members, length = tokens.shape
    seqs = torch.from_numpy(tokens).long().reshape(n * members, length)
    inputs = torch.cat([seqs, torch.full_like(seqs, model.query_token)], dim=1)  # then L query tokens
    jac = state_jacobian(model, inputs, position, method="func").jac
    return jac.reshape(n, members, *jac.shape[1:])


def _spec_score(ga: torch.Tensor, gb: torch.Tensor) -> float:
    """S(A, B) of SPEC §4, row by row."""
    num = sum(float(ga[i] @ gb[i]) for i in range(ga.shape[0]))
    den = sum(float(ga[i].norm() * gb[i].norm()) for i in range(ga.shape[0]))
    return num / den


def _check_probe_roles(ds: xr.Dataset, position: int) -> None:
    """The members named same-target / same-suffix have the structure of SPEC §4."""
    tok = {m: ds["probe_tokens"].sel(member=m).values for m in ("base", "same-target", "same-suffix")}
    p = position
    assert (tok["same-target"][:, :p] == tok["base"][:, :p]).all()  # shares prefix and target
    assert (tok["same-suffix"][:, p:] == tok["base"][:, p:]).all()  # shares the suffix
    assert (tok["same-target"][:, p:] != tok["base"][:, p:]).any()  # … with other suffixes
    assert (tok["same-suffix"][:, :p] != tok["base"][:, :p]).any()  # … with other targets or prefixes


def test_named_pairs_hold_the_score_of_base_and_that_partner(runner: CliRunner, trained_runs: dict,
                                                              tmp_path: Path) -> None:
    ckpt, p = trained_runs["dual"] / "step-0000030.pt", 2
    ds = _stability_store(runner, ckpt, tmp_path / "s.zarr", p)
    assert ds.attrs["target_position"] == p
    assert list(ds["member"].values) == ["base", "same-target", "same-suffix"]
    _check_probe_roles(ds, p)
    tokens = ds["probe_tokens"].values  # (n, member, L)
    jac = _jacobians(ckpt, tokens, p)
    for pair, partner in PARTNER.items():
        expected = [_spec_score(jac[t, 0], jac[t, partner]) for t in range(tokens.shape[0])]
        stored = ds["score_default"].sel(pair=pair).isel(checkpoint=0).values
        np.testing.assert_allclose(stored, expected, atol=2e-5, err_msg=f"pair {pair}")
    # the two pairs differ, so a swap of the labels cannot pass
    st, ss = (ds["score_default"].sel(pair=k).isel(checkpoint=0).values for k in PARTNER)
    assert np.abs(st - ss).max() > 1e-2


@pytest.fixture(scope="module")
def s4d_two_blocks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dual-frequency S4D run with two blocks. (With one block the transition is input-independent,
    J_c = R_T · conj(C dA^(T−p)) with R_T real, so every Wirtinger score is real: a flipped imaginary
    part would go unseen. The lower block's modes reach the output through the upper block.)"""
    cfg = small_run("s4d", pe="sinusoidal", iterations=100)  # trained enough to depend on its disturbants
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_layers=2),
                              train=dataclasses.replace(cfg.train, checkpoint_every=100, log_every=100))
    run = tmp_path_factory.mktemp("s4d2") / "run"
    train(cfg, run)
    return run / "step-0000100.pt"


def _wirtinger_reference(jac: torch.Tensor, partner: int) -> np.ndarray:
    """Complex score of base vs partner from real-view Jacobians (n, 3, H, D): J_c = ½(∂/∂x + i ∂/∂y)
    per mode (columns interleave x, y: SPEC §4), then Σ_i Σ_m a_im conj(b_im) / Σ_i ‖a_i‖‖b_i‖."""
    jc = 0.5 * torch.complex(jac[..., 0::2], jac[..., 1::2])  # (n, 3, H, D/2)
    a, b = jc[:, 0], jc[:, partner]
    num = (a * b.conj()).sum((-2, -1))
    den = (a.abs().square().sum(-1).sqrt() * b.abs().square().sum(-1).sqrt()).sum(-1)
    return (num / den).numpy()


def test_s4d_wirtinger_imaginary_part_against_the_closed_form(runner: CliRunner, s4d_two_blocks: Path,
                                                              trained_runs: dict, tmp_path: Path) -> None:
    """The stored wirtinger_real/imag of both pairs, against the definition computed here; and for
    single-block S4D, the closed form's consequence: the imaginary part is 0."""
    ds = _stability_store(runner, s4d_two_blocks, tmp_path / "s4d2.zarr", 1)
    tokens = ds["probe_tokens"].values
    jac = _jacobians(s4d_two_blocks, tokens, 1)  # (n, 3, H, D), real view
    for pair, partner in PARTNER.items():
        expected = _wirtinger_reference(jac, partner)
        stored = ds.sel(pair=pair).isel(checkpoint=0)
        np.testing.assert_allclose(stored["wirtinger_imag"].values, expected.imag, atol=2e-5,
                                   err_msg=f"imaginary part, {pair}")
        np.testing.assert_allclose(stored["wirtinger_real"].values, expected.real, atol=2e-5,
                                   err_msg=f"real part, {pair}")
        assert np.abs(expected.imag).max() > 1e-3, "imaginary parts ≈ 0 could not reveal a flipped sign"
    one = _stability_store(runner, trained_runs["complex"] / "step-0000010.pt", tmp_path / "s4d1.zarr", 1)
    np.testing.assert_allclose(one["wirtinger_imag"].values, 0.0, atol=1e-6)
    np.testing.assert_allclose(one["wirtinger_real"].values, one["score_default"].values, atol=1e-6)
