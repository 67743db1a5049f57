"""The Elman, GRU and LSTM cores: the fused module and its functional twin agree (SPEC §2), each gate
term of the step Jacobian is its own path through the cell, written here from the weights (SPEC §7), a
replaced cell falls back to the generic Jacobian, and the static W_hh blocks are the gates' rows."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from gradscope.models import CORES
from gradscope.models.rnn import RNNCore

from tests.models.test_core import B, H, TOL, _autograd, _core, _err, _point
from tests.models.test_seq import _model


@pytest.mark.parametrize("layers", [1, 2])
def test_gru_carry_term_is_diag_u(layers: int) -> None:
    """carry = diag(u) per layer with u = σ(W_iu x + b_iu + W_hu h + b_hu), the upper layer reading
    the lower layer's new h; no cross-layer part (u ⊙ h has no input path)."""
    core = _core("gru", layers)
    x, z = _point(core)
    carry = core.gate_terms(x, z)["carry"]
    expected = torch.zeros_like(carry)
    inp = x
    for layer, h in enumerate(z.split(H, dim=-1)):
        w_ih, w_hh, b_ih, b_hh = (getattr(core.rnn, f"{n}_l{layer}")
                                  for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
        gi, gh = inp @ w_ih.T + b_ih, h @ w_hh.T + b_hh
        r = torch.sigmoid(gi[:, :H] + gh[:, :H])
        u = torch.sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
        n = torch.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
        expected[:, layer * H:(layer + 1) * H, layer * H:(layer + 1) * H] = torch.diag_embed(u)
        inp = (1 - u) * n + u * h
    assert _err(carry - expected) <= TOL


def test_lstm_forget_term_is_the_c_carry() -> None:
    """forget = [[0, diag(o(1 − tanh²c')·f)], [0, diag(f)]] on [h, c]: the c columns, nothing else."""
    core = _core("lstm", 1)
    x, z = _point(core)
    h, c = z.chunk(2, dim=-1)
    pre = x @ core.rnn.weight_ih_l0.T + core.rnn.bias_ih_l0 + h @ core.rnn.weight_hh_l0.T + core.rnn.bias_hh_l0
    i, f, g, o = torch.sigmoid(pre[:, :H]), torch.sigmoid(pre[:, H:2 * H]), torch.tanh(pre[:, 2 * H:3 * H]), \
        torch.sigmoid(pre[:, 3 * H:])
    c_new = f * c + i * g
    expected = torch.zeros(B, 2 * H, 2 * H, dtype=torch.float64)
    expected[:, :H, H:] = torch.diag_embed(o * (1 - torch.tanh(c_new) ** 2) * f)
    expected[:, H:, H:] = torch.diag_embed(f)
    assert _err(core.gate_terms(x, z)["forget"] - expected) <= TOL


def _path_jacobians(fn, x: Tensor, inputs: tuple[Tensor, ...]) -> list[Tensor]:  # type: ignore[no-untyped-def]
    """∂fn/∂input_k for each of fn's state inputs (batch diagonal kept) → [(B, out, in_k)]."""
    full = torch.autograd.functional.jacobian(lambda *a: fn(x, *a), inputs)
    return [torch.stack([j[b, :, b] for b in range(x.shape[0])]) for j in full]


def test_each_gru_term_is_its_own_path() -> None:
    """Feed h to each path of the cell as a separate argument (carry, r, u, n); the derivative with
    respect to that argument alone, at all arguments equal to h, is that path's term."""
    core = _core("gru", 1)
    x, h = _point(core)
    w_ih, w_hh, b_ih, b_hh = core.layer_weights(0)

    def paths(x_: Tensor, h_carry: Tensor, h_r: Tensor, h_u: Tensor, h_n: Tensor) -> Tensor:
        gi = (x_ @ w_ih.T + b_ih).chunk(3, dim=-1)
        r = torch.sigmoid(gi[0] + h_r @ w_hh[:H].T + b_hh[:H])
        u = torch.sigmoid(gi[1] + h_u @ w_hh[H:2 * H].T + b_hh[H:2 * H])
        n = torch.tanh(gi[2] + r * (h_n @ w_hh[2 * H:].T + b_hh[2 * H:]))
        return (1 - u) * n + u * h_carry

    expected = _path_jacobians(paths, x, (h,) * 4)
    terms = core.gate_terms(x, h)
    for name, jac in zip(("carry", "r", "u", "n"), expected):
        assert _err(terms[name] - jac) <= TOL, name


def test_each_lstm_term_is_its_own_path() -> None:
    """The same for the LSTM on [h, c]: h fed separately to the i, f, g, o pre-activations, and c
    (the carry f ⊙ c) to the ``forget`` term, which owns the c columns."""
    core = _core("lstm", 1)
    x, z = _point(core)
    h, c = z.chunk(2, dim=-1)
    w_ih, w_hh, b_ih, b_hh = core.layer_weights(0)

    def paths(x_: Tensor, c_: Tensor, h_i: Tensor, h_f: Tensor, h_g: Tensor, h_o: Tensor) -> Tensor:
        pre = (x_ @ w_ih.T + b_ih + b_hh).chunk(4, dim=-1)
        i, f, g, o = (act(p + h_k @ w_k.T) for act, p, h_k, w_k in
                      zip((torch.sigmoid, torch.sigmoid, torch.tanh, torch.sigmoid), pre, (h_i, h_f, h_g, h_o),
                          w_hh.chunk(4)))
        c_new = f * c_ + i * g
        return torch.cat([o * torch.tanh(c_new), c_new], dim=-1)

    d_c, *d_h = _path_jacobians(paths, x, (c, h, h, h, h))
    terms = core.gate_terms(x, z)
    zeros = torch.zeros(B, 2 * H, H, dtype=torch.float64)
    assert _err(terms["forget"] - torch.cat([zeros, d_c], dim=-1)) <= TOL
    for name, jac in zip(("i", "f", "g", "o"), d_h):
        assert _err(terms[name] - torch.cat([jac, zeros], dim=-1)) <= TOL, name


def test_elman_term_is_tanh_derivative_times_w_hh() -> None:
    core = _core("elman", 1)
    x, z = _point(core)
    w_hh = core.rnn.weight_hh_l0
    h_new = torch.tanh(x @ core.rnn.weight_ih_l0.T + core.rnn.bias_ih_l0 + z @ w_hh.T + core.rnn.bias_hh_l0)
    expected = (1 - h_new ** 2)[:, :, None] * w_hh
    assert _err(core.gate_terms(x, z)["h"] - expected) <= TOL


def test_replaced_cell_falls_back_to_the_generic_jacobian() -> None:
    """A core whose cell function was replaced must not use the analytic form of the old cell."""
    core = _core("elman", 2)
    core.cell = lambda x, s, w_ih, w_hh, b_ih, b_hh: (torch.sin(x @ w_ih.T + s @ w_hh.T),) * 2
    x, z = _point(core)
    expected = _autograd(core, x, z)
    assert _err(core.step_jacobian(x, z) - expected) <= TOL
    terms = core.gate_terms(x, z)
    assert list(terms) == ["step"] and _err(terms["step"] - expected) <= TOL


@pytest.mark.parametrize("name", list(CORES))
def test_recurrent_blocks_are_the_gate_blocks_of_w_hh(name: str) -> None:
    core = _core(name, 2)
    blocks = core.recurrent_blocks()
    if not isinstance(core, RNNCore):
        assert blocks == {}
        return
    gates = type(core).gates
    assert list(blocks) == [f"l{layer}/{g}" for layer in (1, 2) for g in gates]
    for layer in (1, 2):
        w_hh = getattr(core.rnn, f"weight_hh_l{layer - 1}")
        for k, g in enumerate(gates):
            assert torch.equal(blocks[f"l{layer}/{g}"], w_hh[k * H:(k + 1) * H])


@pytest.mark.parametrize("core", ["elman", "gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 3])
def test_fused_and_functional_cells_agree(core: str, layers: int) -> None:
    """float32, as trained: the fused nn.RNN/GRU/LSTM and the functional step agree to 1e-5."""
    model = _model(core, pe="sinusoidal", layers=layers)
    tokens = torch.randint(0, 10, (5, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x = model.core_inputs(tokens)
        fused = model.core(x)
        functional, states = model.core.scan(x)
    assert states.shape == (5, 30, model.core.state_dim)
    assert torch.allclose(fused, functional, atol=1e-5, rtol=0)
    # the state layout: the top layer's h is the output (LSTM: first half of the top layer's [h, c])
    top = states[..., -model.core.layer_state:]
    assert torch.allclose(top[..., :10], functional, atol=0, rtol=0)


@pytest.mark.parametrize("core", ["elman", "gru", "lstm"])
def test_functional_cell_matches_fused_hidden_state(core: str) -> None:
    """The full state z (incl. the LSTM cell c) equals what the fused module returns at the end."""
    model = _model(core, layers=2).double()
    tokens = torch.randint(0, 10, (3, 12), generator=torch.Generator().manual_seed(2))
    x = model.core_inputs(tokens)
    _, final = model.core.rnn(x)
    _, states = model.core.scan(x)
    z = states[:, -1]
    if core == "lstm":
        h, c = final
        expected = torch.cat([torch.cat([h[l], c[l]], dim=-1) for l in range(2)], dim=-1)
    else:
        expected = torch.cat([final[l] for l in range(2)], dim=-1)
    assert torch.allclose(z, expected, atol=1e-12)
