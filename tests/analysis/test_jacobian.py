"""State Jacobians ∂y_T/∂z_p (SPEC §4) against float64 oracles: brute force (one autograd.grad per
output row), a linear RNN (J = W_hh^(T−p)), the tanh-RNN product Π diag(1 − h_t²) W_hh, and the
single-block S4D closed form (2a, −2b) with C·dA^(T−p) = a + ib."""

from __future__ import annotations

import functools
import threading

import pytest
import torch

from gradscope.analysis.jacobian import METHODS, iter_state_jacobian, state_jacobian, wirtinger_view
from gradscope.errors import GradscopeError
from gradscope.models import CORES as REGISTERED
from gradscope.models.seq import SeqModel

from tests.helpers.cores import tiny_model

B, T, H, E, K = 3, 7, 5, 4, 6  # sequences, steps, hidden, embedding, vocabulary
ATOL = 1e-10
CORES = tuple(REGISTERED)  # every registered core


def build(core: str, layers: int = 1, pe: str = "none", seed: int = 0) -> SeqModel:
    """A tiny float64 model whose Jacobians are far from 0 (tests/helpers/cores.py)."""
    return tiny_model(core, K, E, H, layers, pe, seed=seed)


cached = functools.cache(build)


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, K + 1, (B, T), generator=torch.Generator().manual_seed(seed))


def scan(model: SeqModel, toks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        x = model.core_inputs(toks)
        ys, zs = model.core.scan(x)
    return x, ys, zs


def brute_force(model: SeqModel, toks: torch.Tensor, p: int) -> torch.Tensor:
    """∂y_T/∂z_p by rolling core.step from z_p with inputs fixed; one autograd.grad per output row."""
    x, _, zs = scan(model, toks)
    z0 = zs[:, p - 1].clone().requires_grad_(True)
    z = z0
    for t in range(p, T):
        y, z = model.core.step(x[:, t], z)
    rows = [torch.autograd.grad(y[:, i].sum(), z0, retain_graph=True)[0] for i in range(y.shape[1])]
    return torch.stack(rows, dim=1)  # (B, H, D); sequences are independent, so the sum separates them


def step_jacobian(model: SeqModel, toks: torch.Tensor, t: int) -> torch.Tensor:
    """∂z_t/∂z_{t−1} (B, D, D) of 1-based step t, by autograd, one sequence at a time."""
    x, _, zs = scan(model, toks)
    return torch.stack([torch.autograd.functional.jacobian(
        lambda z: model.core.step(x[b:b + 1, t - 1], z[None])[1][0], zs[b, t - 2]) for b in range(B)])


def methods_for(core: str, layers: int) -> list[str]:
    """Every engine the core supports, and auto."""
    analytic = cached(core, layers).core.analytic_unsupported() is None
    return [m for m in METHODS if analytic or m != "analytic"] + ["auto"]


@pytest.mark.parametrize("pe", ["none", "sinusoidal"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("core", CORES)
def test_every_method_matches_brute_force(core: str, layers: int, pe: str) -> None:
    model, toks = cached(core, layers, pe), tokens()
    for p in (1, 4, T - 1):
        ref = brute_force(model, toks, p)
        assert ref.norm(dim=(1, 2)).min() > 1e-3, "oracle Jacobian ~0: the comparison would be vacuous"
        for method in methods_for(core, layers):
            res = state_jacobian(model, toks, p, method=method, chunk=2)  # 2 < B: crosses a chunk boundary
            torch.testing.assert_close(res.jac, ref, rtol=0, atol=ATOL, msg=f"{method} at p={p}")
    expected = "analytic" if model.core.analytic_unsupported() is None else "vjp"
    assert state_jacobian(model, toks, 1).method == expected


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("core", CORES)
def test_last_position_is_the_readout_jacobian(core: str, layers: int) -> None:
    """p = T: J_T · ∂z_T/∂z_{T−1} must equal J_{T−1}, and J_T is the readout's own Jacobian ∂y_T/∂z_T
    (for an RNN, the selection of the top layer's h)."""
    model, toks = cached(core, layers), tokens()
    ref_prev = brute_force(model, toks, T - 1)
    step = step_jacobian(model, toks, T)
    x, _, zs = scan(model, toks)
    readout = torch.stack([torch.autograd.functional.jacobian(
        lambda z: model.core.readout(x[b:b + 1, T - 1], z[None])[0], zs[b, T - 1]) for b in range(B)])
    for method in methods_for(core, layers):
        jac = state_jacobian(model, toks, T, method=method).jac
        torch.testing.assert_close(jac @ step, ref_prev, rtol=0, atol=ATOL, msg=method)
        torch.testing.assert_close(jac, readout, rtol=0, atol=ATOL, msg=method)


def linear_cell(x: torch.Tensor, z: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor,
                b_hh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """elman_cell without the tanh."""
    h = x @ w_ih.T + b_ih + z @ w_hh.T + b_hh
    return h, h


def test_linear_rnn_is_a_matrix_power() -> None:
    """Identity activation: J = W_hh^(T−p) for every sequence, whatever the inputs."""
    model = build("elman", pe="sinusoidal")
    model.core.cell = linear_cell
    w_hh = model.core.layer_weights(0)[1]
    with torch.no_grad():
        w_hh.copy_(1.2 * torch.linalg.qr(torch.randn(H, H, dtype=torch.float64,
                                                      generator=torch.Generator().manual_seed(3)))[0])
    toks = tokens()
    for p in (1, 3, T):
        expected = torch.linalg.matrix_power(w_hh.detach(), T - p).expand(B, -1, -1)
        for method in ("func", "vjp", "auto"):
            res = state_jacobian(model, toks, p, method=method)
            torch.testing.assert_close(res.jac, expected, rtol=0, atol=ATOL, msg=f"{method} at p={p}")
    assert state_jacobian(model, toks, 1).method == "vjp"  # the analytic engine knows only the stock cell
    with pytest.raises(GradscopeError, match="method"):
        state_jacobian(model, toks, 1, method="analytic")


def test_tanh_rnn_is_a_product_of_known_matrices() -> None:
    """Elman: ∂h_t/∂h_{t−1} = diag(1 − h_t²) W_hh, so J = Π_{t=T}^{p+1} diag(1 − h_t²) W_hh."""
    model, toks = cached("elman"), tokens()
    _, _, zs = scan(model, toks)
    w_hh = model.core.layer_weights(0)[1].detach()
    p = 2
    expected = torch.eye(H, dtype=torch.float64).expand(B, -1, -1)
    for t in range(T, p, -1):
        expected = expected @ ((1 - zs[:, t - 1] ** 2)[:, :, None] * w_hh)
    assert expected.norm(dim=(1, 2)).min() > 1e-3
    res = state_jacobian(model, toks, p, method="analytic")
    torch.testing.assert_close(res.jac, expected, rtol=0, atol=ATOL)


def mode_coefficient(model: SeqModel, p: int) -> torch.Tensor:
    """a + ib = C_n dA_n^(T−p) per (channel, mode), complex (H, N/2)."""
    dA, _, C = model.core.ssm[0].kernel.discrete()
    return (C * torch.exp((T - p) * torch.log(dA))).detach()


def mode_gain(model: SeqModel, p: int) -> torch.Tensor:
    """Closed form of ∂(2·Re Σ_n C_n x_{T,n})/∂(Re x_p, Im x_p) per (channel, mode): (2a, −2b), (H, N/2, 2)."""
    k = mode_coefficient(model, p)
    return torch.stack([2 * k.real, -2 * k.imag], dim=-1)


def test_s4d_closed_form_without_readout() -> None:
    model = build("s4d", pe="sinusoidal")
    model.core.ssm[0].readout = lambda y: y  # pre-readout output 2·Re(Σ C x_T) + D u_T
    toks, eye = tokens(), torch.eye(H, dtype=torch.float64)
    for p in (1, 4, T):
        gain = mode_gain(model, p)  # (H, N/2, 2)
        expected = (eye[:, :, None, None] * gain).reshape(H, -1).expand(B, -1, -1)  # other channels: 0
        assert expected.norm() > 1e-3
        for method in ("func", "vjp", "auto"):
            res = state_jacobian(model, toks, p, method=method)
            torch.testing.assert_close(res.jac, expected, rtol=0, atol=ATOL, msg=f"{method} at p={p}")
        # conjugate Wirtinger view ½(∂/∂x + i∂/∂y) = a − ib = conj(C dA^(T−p)) on the own channel
        jc = wirtinger_view(res.jac, model).reshape(B, H, H, -1)[:, range(H), range(H)]  # (B, H, N/2)
        torch.testing.assert_close(jc, mode_coefficient(model, p).conj().expand(B, -1, -1), rtol=0, atol=ATOL)
    assert state_jacobian(model, toks, 1).method == "vjp"  # analytic would not see the patched readout


def test_s4d_analytic_is_closed_form_times_readout_jacobian() -> None:
    """With the real GELU/GLU readout: J[b, i, (h, n)] = R_b[i, h]·(2a, −2b), R_b by autograd at y_pre."""
    model, toks = cached("s4d"), tokens()
    block, core = model.core.ssm[0], model.core
    x, _, zs = scan(model, toks)
    dA, _, C = block.kernel.discrete()
    with torch.no_grad():
        state = torch.view_as_complex(zs[:, T - 1].reshape(B, H, -1, 2).contiguous())
        y_pre = 2 * (C * state).real.sum(-1) + block.D * core.in_proj(x[:, T - 1])  # D-skip included
    readout = torch.stack([torch.autograd.functional.jacobian(block.readout, y_pre[b]) for b in range(B)])
    for p in (1, T):
        expected = (readout[..., None, None] * mode_gain(model, p)).reshape(B, H, -1)
        torch.testing.assert_close(state_jacobian(model, toks, p, method="analytic").jac, expected,
                                   rtol=0, atol=ATOL)


@pytest.mark.parametrize("core", CORES)
def test_shapes_output_and_state(core: str) -> None:
    model, toks = cached(core, 2, "sinusoidal"), tokens()
    p = 3
    res = state_jacobian(model, toks, p)
    D = model.core.state_dim
    assert res.jac.shape == (B, H, D) and res.output.shape == (B, H) and res.state.shape == (B, D)
    assert res.jac.dtype == res.output.dtype == res.state.dtype == torch.float64
    with torch.no_grad():
        fused = model.core(model.core_inputs(toks))  # nn.RNN/GRU/LSTM or FFT convolution: another path
    torch.testing.assert_close(res.output, fused[:, -1], rtol=0, atol=1e-10)
    _, ys, zs = scan(model, toks)
    # bit for bit: the same process and code path (scan)
    assert torch.equal(res.state, zs[:, p - 1]) and torch.equal(res.output, ys[:, -1])


@pytest.mark.parametrize("core", ["gru", "lstm"])
def test_float32_model_stays_float32_and_agrees(core: str) -> None:
    model, toks = build(core).float(), tokens()
    fast, ref = (state_jacobian(model, toks, 1, method=m).jac for m in ("analytic", "func"))
    assert fast.dtype == torch.float32
    torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-6)


def test_user_errors_name_the_argument() -> None:
    model, toks = cached("gru"), tokens()
    for bad in (0, T + 1, -1):
        with pytest.raises(GradscopeError, match=rf"position: got {bad}; .*\[1, {T}\]"):
            state_jacobian(model, toks, bad)
    with pytest.raises(GradscopeError, match="method: got 'jacfwd'"):
        state_jacobian(model, toks, 1, method="jacfwd")
    with pytest.raises(GradscopeError, match="chunk"):
        state_jacobian(model, toks, 1, chunk=0)
    with pytest.raises(GradscopeError, match="tokens"):
        state_jacobian(model, toks[0], 1)
    with pytest.raises(GradscopeError, match="method: 'analytic'.*2 blocks"):
        state_jacobian(cached("s4d", 2), toks, 1, method="analytic")
    with pytest.raises(GradscopeError, match="model"):
        wirtinger_view(torch.zeros(1, H, H), model)


def test_gradients_stay_on_in_the_callers_thread() -> None:
    """A suspended chunk generator must not leave gradients off for its caller, nor when it is finalised
    on another thread (as when a profiler thread holds the frame). An intermittent sweep failure on a dask
    worker (a training task without gradients) was traced to this; that exact trigger was not isolated."""
    model, toks = cached("gru"), tokens()
    parts = iter_state_jacobian(model, toks, 1, chunk=1)
    next(parts)
    assert torch.is_grad_enabled()  # suspended mid-iteration: the caller's mode is untouched
    state_jacobian(model, toks, 1, chunk=B)  # one chunk: returns before its generator is exhausted
    assert torch.is_grad_enabled()
    finaliser = threading.Thread(target=parts.close)  # finalised on another thread
    finaliser.start()
    finaliser.join()
    assert torch.is_grad_enabled()
