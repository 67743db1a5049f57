"""A third-party recurrent architecture out of the box (issues #14 and #25): mambapy's Mamba and LM.

``gradscope.wrap(mamba)`` uses the installed adapter (gradscope/models/adapters/mambapy.py), which runs
mambapy's own recurrent step; here it is checked (1) against mambapy's own full-sequence forward
(parallel scan), (2) gradscope's engines against an independent float64 brute force that works on
mambapy's caches directly, and (3) for an LM, the stability score, gradient flow and Σλ against the
brute force of tests/helpers/adapterkit.py. mambapy is a test dependency: this file fails, not skips, without it.
"""

from __future__ import annotations

import pytest
import torch
from mambapy.mamba import Mamba, MambaConfig
from torch import nn

import gradscope
from tests.helpers.adapterkit import Family, check_gradient_flow, check_lyapunov_sum, check_stability
from gradscope.errors import GradscopeError
from gradscope.models.adapters.mambapy import MambapyCore as MambaCore
from gradscope.models.core import scan

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
    The columns are laid out as documented: per layer the conv window (ED, d_conv − 1) then h (ED, N), flat.
    """
    cfg = mamba.config
    caches = [(x.new_zeros(B, cfg.d_inner, cfg.d_state), x.new_zeros(B, cfg.d_inner, cfg.d_conv - 1))
              for _ in range(cfg.n_layers)]
    with torch.no_grad():
        for t in range(p):
            _, caches = mamba.step(x[:, t], list(caches))
    leaves = [c.clone().requires_grad_(True) for cache in caches for c in reversed(cache)]  # [conv, h] per layer
    caches = [(leaves[2 * i + 1], leaves[2 * i]) for i in range(cfg.n_layers)]
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
    assert list(layout) == [f"l{i}/{k}" for i in range(N_LAYERS) for k in ("conv", "ssm")]
    assert layout[f"l{N_LAYERS - 1}/ssm"].stop == core.state_dim
    with torch.no_grad():  # layer 1's conv inputs (B, T, ED): the x-branch of in_proj(norm(x))
        h_in = mamba.layers[0].mixer.in_proj(mamba.layers[0].norm(x))[..., :core.d_inner]
    window = zs[:, -1, layout["l0/conv"]].reshape(B, core.d_inner, D_CONV - 1)
    assert (window - h_in[:, -(D_CONV - 1):].transpose(1, 2)).abs().max() < 1e-12


@pytest.mark.parametrize("method", ["vjp", "func"])
@pytest.mark.parametrize("p", [1, 3, T - 1])
def test_state_jacobian_matches_brute_force(mamba, x, method, p):
    model = gradscope.wrap(mamba)
    assert isinstance(model.core, MambaCore) and model.core.mamba is mamba
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
        gradscope.state_jacobian(gradscope.wrap(mamba), x, T, method="vjp")


def test_token_ids_through_an_embedding(mamba):
    K = 11
    torch.manual_seed(2)
    emb = nn.Embedding(K, D_MODEL).double()
    tokens = torch.randint(0, K, (B, T), generator=torch.Generator().manual_seed(3))
    core = MambaCore(mamba)
    with torch.no_grad():
        vectors = emb(tokens)
    for p in (2, T - 1):
        by_id = gradscope.state_jacobian(gradscope.wrap(mamba, inputs=emb), tokens, p, method="vjp")
        by_vec = gradscope.state_jacobian(gradscope.wrap(mamba), vectors, p, method="vjp")
        assert by_id.jac.abs().max() > 1e-3
        assert (by_id.jac - by_vec.jac).abs().max() < 1e-12
        assert (by_id.output - by_vec.output).abs().max() < 1e-12
        assert (by_id.jac - brute_force(mamba, vectors, p)[0]).abs().max() < 1e-10


def test_diagonal_blocks_are_the_generic_ones(mamba, x) -> None:  # noqa: ANN001
    """The adapter's own exp(Δ A) and shift blocks equal torch.func restricted to each declared block."""
    from gradscope.models.core import generic_diagonal_blocks

    core = gradscope.wrap(mamba).core
    z = scan(core, x)[1][:, 3]
    for own, generic in zip(core.diagonal_blocks(x[:, 4], z), generic_diagonal_blocks(core, x[:, 4], z)):
        assert own.shape == generic.shape and (own - generic).abs().max() < 1e-12


def test_stability_flow_and_lyapunov_sum_against_mambapy(mamba) -> None:  # noqa: ANN001
    """Token ids through an embedding: the checks every library family runs, through mambapy's own step."""
    emb = nn.Embedding(13, D_MODEL).double()
    nn.init.normal_(emb.weight, generator=torch.Generator().manual_seed(3))
    wrapped = gradscope.wrap(mamba, inputs=emb)
    assert wrapped.core.mamba is mamba and wrapped.inputs is emb

    def state(tokens):  # noqa: ANN001, ANN202
        cfg = mamba.config
        caches = [(None, torch.zeros(tokens.shape[0], cfg.d_inner, cfg.d_conv - 1, dtype=torch.float64))
                  for _ in range(cfg.n_layers)]
        for t in range(tokens.shape[1]):
            _, caches = mamba.step(emb(tokens[:, t]), caches)
        return [q for h, window in caches for q in (window, h)]

    def step(parts, columns, t0):  # noqa: ANN001, ANN202
        caches = [(parts[2 * i + 1], parts[2 * i]) for i in range(len(parts) // 2)]
        for t in range(columns.shape[1]):
            y, caches = mamba.step(emb(columns[:, t]), caches)
        return y, [q for h, window in caches for q in (window, h)]

    fam = Family(mamba, state, step, 13)
    tok = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(4))
    check_stability(fam, wrapped, L=5, p=2, rtol=1e-9)
    check_gradient_flow(fam, wrapped, tok, rtol=1e-9)
    check_lyapunov_sum(fam, wrapped, torch.randint(0, 13, (2, 9), generator=torch.Generator().manual_seed(5)),
                       warmup=2, atol=1e-9)
