"""A third-party recurrent architecture through the core protocol (issue #14, item 5): mambapy's Mamba.

The adapter (docs/examples/mambapy_core.py) runs mambapy's own recurrent step; here it is checked
(1) against mambapy's own full-sequence forward (parallel scan), and (2) gradscope's generic
engines against an independent float64 brute force that works on mambapy's caches directly.
mambapy is a test dependency: this file fails, not skips, without it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from mambapy.mamba import Mamba, MambaConfig
from torch import nn

import gradscope
from gradscope.errors import GradscopeError
from gradscope.models.core import scan

_spec = importlib.util.spec_from_file_location(
    "mambapy_core", Path(__file__).resolve().parents[1] / "docs" / "examples" / "mambapy_core.py")
mambapy_core = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mambapy_core)
MambaCore = mambapy_core.MambaCore

B, T, D_MODEL, N_LAYERS, D_STATE, D_CONV = 3, 7, 8, 2, 4, 3  # T = 7: not a power of two (pscan pads)


@pytest.fixture(scope="module")
def mamba() -> Mamba:
    torch.manual_seed(0)
    cfg = MambaConfig(d_model=D_MODEL, n_layers=N_LAYERS, d_state=D_STATE, d_conv=D_CONV,
                      dt_min=0.05, dt_max=0.5, bias=True)
    model = Mamba(cfg).double().eval()
    with torch.no_grad():  # the default init leaves D = 1 and zero biases: make every term count
        for block in model.layers:
            block.mixer.D.uniform_(0.5, 1.5)
            block.mixer.in_proj.bias.normal_(0.0, 0.1)
            block.mixer.out_proj.bias.normal_(0.0, 0.1)
            block.norm.weight.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(B, T, D_MODEL, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def brute_force(mamba: Mamba, x: torch.Tensor, p: int):
    """(J (B, H, D), y_T (B, H), z_p (B, D)) in float64, straight from mambapy's step on its caches.

    Independent of gradscope and of the adapter's own code: z_p is rolled from mambapy's initial cache,
    then every cache tensor is a leaf; steps p+1 … T reuse the fixed inputs; one autograd.grad per output
    row (sequences are independent, so summing the row over the batch gives each sequence's gradient).
    The columns are laid out as documented: per layer h (ED, N) then the conv window (ED, d_conv − 1), flat.
    """
    cfg = mamba.config
    caches = [(x.new_zeros(B, cfg.d_inner, cfg.d_state), x.new_zeros(B, cfg.d_inner, cfg.d_conv - 1))
              for _ in range(cfg.n_layers)]
    with torch.no_grad():
        for t in range(p):
            _, caches = mamba.step(x[:, t], list(caches))
    leaves = [c.clone().requires_grad_(True) for cache in caches for c in cache]
    caches = [(leaves[2 * i], leaves[2 * i + 1]) for i in range(cfg.n_layers)]
    y = None
    for t in range(p, T):
        y, caches = mamba.step(x[:, t], list(caches))
    rows = []
    for i in range(y.shape[1]):
        grads = torch.autograd.grad(y[:, i].sum(), leaves, retain_graph=True, allow_unused=True)
        rows.append(torch.cat([(torch.zeros_like(leaf) if g is None else g).reshape(B, -1)
                               for g, leaf in zip(grads, leaves)], dim=1))
    z_p = torch.cat([leaf.detach().reshape(B, -1) for leaf in leaves], dim=1)
    return torch.stack(rows, dim=1), y.detach(), z_p


def test_adapter_matches_mambapy_forward(mamba, x):
    """Step by step through the adapter = mambapy's own parallel-scan forward, at every step."""
    core = MambaCore(mamba)
    assert core.state_dim == N_LAYERS * 2 * D_MODEL * (D_STATE + D_CONV - 1)
    assert core.out_dim == D_MODEL
    assert core.mamba is mamba  # a reference, no copies
    with torch.no_grad():
        parallel = mamba(x)
        ys, zs = scan(core, x)
        direct = gradscope.wrap(core)(x)
    assert parallel.abs().max() > 0.1
    assert (ys - parallel).abs().max() < 1e-10
    assert (direct - parallel).abs().max() < 1e-10
    # the scanned states are mambapy's caches, in the documented layout
    layout = core.state_layout()
    assert list(layout) == [f"{k}{i}" for i in range(1, N_LAYERS + 1) for k in ("h", "conv")]
    assert layout[f"conv{N_LAYERS}"].stop == core.state_dim
    with torch.no_grad():  # layer 1's conv inputs (B, T, ED): the x-branch of in_proj(norm(x))
        h_in = mamba.layers[0].mixer.in_proj(mamba.layers[0].norm(x))[..., :core.d_inner]
    window = zs[:, -1, layout["conv1"]].reshape(B, core.d_inner, D_CONV - 1)
    assert (window - h_in[:, -(D_CONV - 1):].transpose(1, 2)).abs().max() < 1e-12


@pytest.mark.parametrize("method", ["vjp", "func"])
@pytest.mark.parametrize("p", [1, 3, T - 1])
def test_state_jacobian_matches_brute_force(mamba, x, method, p):
    model = gradscope.wrap(MambaCore(mamba))
    res = gradscope.state_jacobian(model, x, p, method=method)
    jac, y_T, z_p = brute_force(mamba, x, p)
    assert res.method == method
    assert res.jac.shape == (B, D_MODEL, model.core.state_dim) and res.jac.dtype == torch.float64
    assert (res.state - z_p).abs().max() < 1e-12
    assert (res.output - y_T).abs().max() < 1e-10
    layout = model.core.state_layout()
    for name in layout:  # every block of the state (each layer's h and conv window) is exercised
        assert jac[..., layout[name]].abs().max() > 1e-5, name  # >> the 1e-10 tolerance
    assert (res.jac - jac).abs().max() < 1e-10 * max(1.0, float(jac.abs().max()))


def test_p_equal_T_needs_a_readout(mamba, x):
    """Mamba's y_T is not a function of (z_T, x_T) (the conv's oldest input has left the cache)."""
    with pytest.raises(GradscopeError, match="readout"):
        gradscope.state_jacobian(gradscope.wrap(MambaCore(mamba)), x, T, method="vjp")


def test_token_ids_through_an_embedding(mamba):
    K = 11
    torch.manual_seed(2)
    emb = nn.Embedding(K, D_MODEL).double()
    tokens = torch.randint(0, K, (B, T), generator=torch.Generator().manual_seed(3))
    core = MambaCore(mamba)
    with torch.no_grad():
        vectors = emb(tokens)
    for p in (2, T - 1):
        by_id = gradscope.state_jacobian(gradscope.wrap(core, inputs=emb), tokens, p, method="vjp")
        by_vec = gradscope.state_jacobian(gradscope.wrap(core), vectors, p, method="vjp")
        assert by_id.jac.abs().max() > 1e-3
        assert (by_id.jac - by_vec.jac).abs().max() < 1e-12
        assert (by_id.output - by_vec.output).abs().max() < 1e-12
        assert (by_id.jac - brute_force(mamba, vectors, p)[0]).abs().max() < 1e-10
