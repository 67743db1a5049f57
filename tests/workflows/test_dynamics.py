"""`gradscope dynamics` end to end (issue #16): the store's numbers against independent computations
on the same checkpoint, the Python API and bad input (the report's figures of its store: tests/reports/test_dynamics_figures.py)."""

from __future__ import annotations

import dataclasses

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

import gradscope
from gradscope.cli.app import app
from gradscope.models.core import scan
from gradscope.workflows.dynamics import DynamicsOptions, run_checkpoint_dynamics, task_trajectories

SMALL = ["--sequences", "2", "--grid-sequences", "2", "--trajectories", "3", "--steps", "64", "--lyap-warmup", "8",
         "--sv", "4", "-q"]


@pytest.fixture(scope="module")
def dynamics_store(trained_runs: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from typer.testing import CliRunner
    out = tmp_path_factory.mktemp("dyn") / "d.zarr"
    result = CliRunner().invoke(app, ["dynamics", str(trained_runs["dual"]), "-o", str(out), *SMALL])
    assert result.exit_code == 0, result.stderr
    assert "gradient dynamics per checkpoint" in result.stdout
    return out


def test_store_layout_and_flow_matches_state_jacobian(dynamics_store: Path, trained_runs: dict) -> None:
    ds = xr.open_zarr(dynamics_store, consolidated=False).load()
    assert ds.attrs["kind"] == "dynamics"
    n_ckpt = len(list(trained_runs["dual"].glob("step-*.pt")))
    assert ds.sizes["checkpoint"] == n_ckpt >= 2
    D = 16  # conftest's dual run: hidden 16
    assert ds["lyapunov"].shape == (n_ckpt, 3, D) and ds.sizes["exponent"] == D
    assert (np.diff(ds["lyapunov"].values, axis=-1) <= 1e-12).all()  # sorted descending
    assert set(ds["token_class"].values.ravel()) <= {"frequent", "rare", "query"}
    # independent: ‖∂y_T/∂z_k‖_F from state_jacobian on the stored tokens of the last checkpoint
    loaded = gradscope.load(trained_runs["dual"])
    model = loaded.model.double()
    tokens = ds["tokens"].values.copy()
    tokens[tokens < 0] = model.query_token
    tokens = torch.from_numpy(tokens)
    for k in (1, 3, tokens.shape[1]):
        jac = gradscope.state_jacobian(model, tokens, k).jac
        np.testing.assert_allclose(ds["flow_fro"].values[-1, :, k - 1], torch.linalg.matrix_norm(jac).numpy(),
                                   rtol=1e-4)
        np.testing.assert_allclose(ds["flow_spectral"].values[-1, :, k - 1],
                                   torch.linalg.matrix_norm(jac, ord=2).numpy(), rtol=1e-4)


def test_gate_norms_and_radius_are_those_of_the_steps(dynamics_store: Path, trained_runs: dict) -> None:
    ds = xr.open_zarr(dynamics_store, consolidated=False).load()
    model = gradscope.load(trained_runs["dual"]).model.double()
    tokens = ds["tokens"].values.copy()
    tokens[tokens < 0] = model.query_token
    with torch.no_grad():
        x = model.core_inputs(torch.from_numpy(tokens))
        _, zs = scan(model.core, x)
        t = 5  # step 6 reads x[:, 5] from the state after step 5
        terms = model.core.gate_terms(x[:, t], zs[:, t - 1])
    assert list(ds["gate"].values) == list(terms)
    expected = torch.stack([torch.linalg.matrix_norm(v) for v in terms.values()], -1).numpy()
    np.testing.assert_allclose(ds["gate_norm"].values[-1, :, t], expected, rtol=1e-4)
    J = sum(terms.values())
    radius = torch.linalg.eigvals(J).abs().amax(-1).numpy()
    np.testing.assert_allclose(ds["step_radius"].values[-1, :, t], radius, rtol=1e-4)


def test_stored_lyapunov_is_the_analysis_on_the_task_trajectories(dynamics_store: Path, trained_runs: dict) -> None:
    from gradscope.analysis.lyapunov import lyapunov_spectrum
    ds = xr.open_zarr(dynamics_store, consolidated=False).load()
    loaded = gradscope.load(trained_runs["dual"])
    x = task_trajectories(loaded.model, loaded.config, 64, 3, seed=1)  # the store's seed 0 + 1
    res = lyapunov_spectrum(loaded.model.core, x, warmup=8, reorth=1)
    np.testing.assert_allclose(ds["lyapunov"].values[-1], res.exponents.double().numpy(), rtol=1e-5, atol=1e-7)


def test_python_api_equals_cli(dynamics_store: Path, trained_runs: dict) -> None:
    ds = gradscope.dynamics(trained_runs["dual"], sequences=2, trajectories=3, steps=64, lyap_warmup=8,
                            parts=("flow", "lyapunov"))  # grid_sequences and sv would be refused: no grid or spectra
    cli = xr.open_zarr(dynamics_store, consolidated=False).load()
    # bit for bit: the CLI runs in this process (CliRunner), on the same code path
    np.testing.assert_array_equal(ds["flow_fro"].values, cli["flow_fro"].values)
    np.testing.assert_array_equal(ds["lyapunov"].values, cli["lyapunov"].values)
    assert "tT_grid" not in ds and "gate_norm" not in ds


def test_every_core_runs(trained_runs: dict) -> None:
    for name in ("other", "complex"):
        run = run_checkpoint_dynamics([trained_runs[name]], DynamicsOptions(sequences=1, grid_sequences=1, trajectories=2,
                                                                 steps=40, lyap_warmup=4, sv=2))
        ds = run.to_xarray()
        D = ds.sizes["exponent"]
        assert D == gradscope.load(trained_runs[name]).model.core.state_dim
        assert np.isfinite(ds["lyapunov"].values).all() and np.isfinite(ds["flow_fro"].values).all()


def test_dynamics_of_a_wrapped_lstm_language_model() -> None:
    """The user's own model (issue #14's wrap) through gradscope.dynamics: flow equals state_jacobian
    norms, the exponents are those of analysis.lyapunov_spectrum on the same trajectories."""
    from torch import nn

    from gradscope.analysis.lyapunov import lyapunov_spectrum
    torch.manual_seed(0)
    emb, lstm = nn.Embedding(20, 6), nn.LSTM(6, 8, num_layers=2, batch_first=True).double().eval()
    emb = emb.double()
    model = gradscope.wrap(lstm, inputs=emb)
    tokens = torch.randint(0, 20, (3, 10), generator=torch.Generator().manual_seed(1))
    traj = torch.randint(0, 20, (2, 80), generator=torch.Generator().manual_seed(2))
    ds = gradscope.dynamics(model, tokens=tokens, trajectory_tokens=traj, steps=80, lyap_warmup=5,
                            counts=torch.arange(20, 0, -1))
    assert ds.sizes["exponent"] == 2 * 2 * 8 and list(ds["gate"].values) == ["forget", "i", "f", "g", "o"]
    assert set(ds["token_class"].values.ravel()) <= {"frequent", "rare"}
    jac = gradscope.state_jacobian(model, tokens, 4).jac
    np.testing.assert_allclose(ds["flow_fro"].values[0, :, 3], torch.linalg.matrix_norm(jac).numpy(), rtol=1e-10)
    with torch.no_grad():
        ref = lyapunov_spectrum(model.core, model.core_inputs(traj), warmup=5).exponents
    np.testing.assert_allclose(ds["lyapunov"].values[0], ref.numpy(), rtol=1e-10)


def test_short_runs_need_no_warmup_flag(trained_runs: dict, runner, tmp_path: Path) -> None:
    """`--parts lyapunov --steps 50 --trajectories 1` once failed with "--warmup: got 100" (now --lyap-warmup); the warm-up
    now follows --steps (a tenth, at most 100), and an explicit one too large says which value fits."""
    ckpt = sorted(trained_runs["dual"].glob("step-*.pt"))[-1]
    ok = runner.invoke(app, ["dynamics", str(ckpt), "--parts", "lyapunov", "--steps", "50", "--trajectories", "1",
                             "-o", str(tmp_path / "a.zarr"), "-q"])
    assert ok.exit_code == 0, ok.stderr
    ds = xr.open_zarr(tmp_path / "a.zarr", consolidated=False)
    assert json.loads(ds.attrs["options"])["lyap_warmup"] == 5
    bad = runner.invoke(app, ["dynamics", str(ckpt), "--parts", "lyapunov", "--steps", "50", "--lyap-warmup", "60",
                              "-o", str(tmp_path / "b.zarr")])
    assert bad.exit_code == 2 and "below steps = 50" in bad.stderr and bad.stderr.count("\n") == 1
    # the rule is the workflow's: from Python too, an option of a part left out is refused, not recorded and ignored
    # (found in review: gradscope.dynamics(run, parts="grid", lyap_warmup=5) wrote lyap_warmup into the store)
    for given, names in (({"parts": "grid", "lyap_warmup": 5}, "lyap_warmup"), ({"parts": "flow", "sv": 3}, "sv"),
                         ({"parts": "lyapunov", "sequences": 2, "target_freq": ("rare",)}, "sequences/target_freq")):
        with pytest.raises(gradscope.GradscopeError, match=f"^{names}: they set the "):
            gradscope.dynamics(ckpt, **given)
    # the same through opts=, and an option at its default is not "given" (second review): a plan whose budget is
    # too small is reached, so nothing was refused before it; keywords beside opts= set over it
    with pytest.raises(gradscope.GradscopeError, match="^lyap_warmup: they set the lyapunov part"):
        gradscope.dynamics(ckpt, opts=DynamicsOptions(parts=("flow",), lyap_warmup=5))
    with pytest.raises(gradscope.GradscopeError, match="^budget_seconds"):
        gradscope.dynamics(ckpt, **dataclasses.asdict(DynamicsOptions(parts=("flow",), budget_seconds=1e-9)))
    with pytest.raises(gradscope.GradscopeError, match="^budget_seconds: the asked work"):  # keywords set over opts
        gradscope.dynamics(ckpt, opts=DynamicsOptions(), parts="flow", budget_seconds=0.001)
