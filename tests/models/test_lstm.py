"""The LSTM core (gradscope/models/lstm.py) on its own: its functional cell on [h, c] (PyTorch's gate order i, f,
g, o) against torch.nn.LSTMCell with the same weights, its analytic cell Jacobian and VJP against torch.func.jacrev
of that cell, and the input parts of its gate terms against each gate's own path, all in float64. The
registry-wide contract (tests/project/test_contracts.py) and the whole-core tests (tests/models/test_core.py,
tests/models/test_rnn.py: the terms' state parts) run it as every core; this file checks the cell functions."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from gradscope.models.lstm import LSTMConfig, LSTMCore, lstm_cell, lstm_jacobian, lstm_terms, lstm_vjp

F64 = torch.float64
IN, H, B, R = 3, 4, 2, 5
TOL = 1e-12


def weights(seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(W_ih (4H, in), W_hh (4H, H), b_ih (4H), b_hh (4H)), W_hh at gain 2 so every gate is away from linear."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(4 * H, IN, generator=gen, dtype=F64),
            2 * torch.randn(4 * H, H, generator=gen, dtype=F64) / H ** 0.5,
            torch.randn(4 * H, generator=gen, dtype=F64), torch.randn(4 * H, generator=gen, dtype=F64))


def point(seed: int = 1) -> tuple[Tensor, Tensor]:
    """x (B, in) and a layer state [h, c] (B, 2H), c nonzero."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, IN, generator=gen, dtype=F64), torch.randn(B, 2 * H, generator=gen, dtype=F64)


def jacrev(x: Tensor, s: Tensor, w: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """The oracle: (∂[h', c']/∂[h, c] (B, 2H, 2H), ∂[h', c']/∂x (B, 2H, in)) of the cell by torch.func."""
    def one(x1: Tensor, s1: Tensor) -> Tensor:
        return lstm_cell(x1[None], s1[None], *w)[1][0]
    j_x, j_s = torch.func.vmap(torch.func.jacrev(one, argnums=(0, 1)))(x, s)
    return j_s, j_x


def test_the_cell_is_torch_lstm_cell() -> None:
    """The output is h'; the new layer state is [h', c'], as nn.LSTMCell's (h', c')."""
    w = weights()
    ref = nn.LSTMCell(IN, H, dtype=F64)
    with torch.no_grad():
        for p, v in zip((ref.weight_ih, ref.weight_hh, ref.bias_ih, ref.bias_hh), w):
            p.copy_(v)
    x, s = point()
    out, state = lstm_cell(x, s, *w)
    with torch.no_grad():
        h_ref, c_ref = ref(x, (s[:, :H], s[:, H:]))
    assert state.shape == (B, 2 * H)
    torch.testing.assert_close(state, torch.cat([h_ref, c_ref], dim=-1), rtol=0, atol=TOL)
    assert torch.equal(out, state[:, :H])


@pytest.mark.parametrize("need_input", [False, True])
def test_the_cell_jacobian_is_jacrev_of_the_cell(need_input: bool) -> None:
    w = weights()
    x, s = point()
    j_s, j_x = lstm_jacobian(x, s, w, need_input)
    ref_s, ref_x = jacrev(x, s, w)
    assert j_s.shape == (B, 2 * H, 2 * H)
    torch.testing.assert_close(j_s, ref_s, rtol=0, atol=TOL)
    if need_input:
        assert j_x is not None and j_x.shape == (B, 2 * H, IN)
        torch.testing.assert_close(j_x, ref_x, rtol=0, atol=TOL)
    else:
        assert j_x is None
    assert ref_s[:, :, H:].abs().max() > 0.1 and ref_x.abs().max() > 0.1  # the c columns too


@pytest.mark.parametrize("need_input", [False, True])
def test_the_cell_vjp_is_rows_times_the_jacobian(need_input: bool) -> None:
    """Rows g on [h', c'] → g · ∂[h', c']/∂[h, c] written into ``out``; g · ∂[h', c']/∂x returned when
    asked."""
    w = weights()
    x, s = point()
    g = torch.randn(B, R, 2 * H, generator=torch.Generator().manual_seed(2), dtype=F64)
    out = torch.full((B, R, 2 * H), float("nan"), dtype=F64)
    rows_x = lstm_vjp(x, s, w, g.clone(), out, need_input)  # g: a spent buffer it may overwrite
    ref_s, ref_x = jacrev(x, s, w)
    torch.testing.assert_close(out, g @ ref_s, rtol=0, atol=TOL)
    if need_input:
        assert rows_x is not None
        torch.testing.assert_close(rows_x, g @ ref_x, rtol=0, atol=TOL)
    else:
        assert rows_x is None


def test_each_terms_input_part_is_its_gates_own_path() -> None:
    """Feed x to each gate's pre-activation as a separate argument (i, f, g, o): the derivative of [h', c'] with
    respect to that argument alone, at all arguments equal to x, is that gate's input part; ``forget`` (the
    carry f ⊙ c) reads no input. The input parts sum to ∂[h', c']/∂x and the state parts to
    ∂[h', c']/∂[h, c]."""
    w_ih, w_hh, b_ih, b_hh = w = weights()
    x, s = point()

    def paths(x_i: Tensor, x_f: Tensor, x_g: Tensor, x_o: Tensor, s1: Tensor) -> Tensor:
        h, c = s1.chunk(2, dim=-1)
        rec = (h @ w_hh.T + b_hh + b_ih).chunk(4, dim=-1)
        i, f, g, o = (act(x_k @ w_k.T + r_k) for act, x_k, w_k, r_k in
                      zip((torch.sigmoid, torch.sigmoid, torch.tanh, torch.sigmoid), (x_i, x_f, x_g, x_o),
                          w_ih.chunk(4), rec))
        c_new = f * c + i * g
        return torch.cat([o * torch.tanh(c_new), c_new], dim=-1)

    ref = torch.func.vmap(torch.func.jacrev(paths, argnums=(0, 1, 2, 3)))(x, x, x, x, s)  # 4 × (B, 2H, in)
    terms = lstm_terms(x, s, w, True)
    assert tuple(terms) == LSTMCore.gate_names
    assert terms["forget"][1] is None
    for name, jac in zip(("i", "f", "g", "o"), ref):
        torch.testing.assert_close(terms[name][1], jac, rtol=0, atol=TOL, msg=name)
        assert jac.abs().max() > 1e-3, name
    assert torch.count_nonzero(terms["o"][1][:, H:]) == 0  # o reaches h' only
    j_s, j_x = lstm_jacobian(x, s, w, True)
    torch.testing.assert_close(sum(t[1] for t in terms.values() if t[1] is not None), j_x, rtol=0, atol=TOL)
    torch.testing.assert_close(sum(t[0] for t in terms.values()), j_s, rtol=0, atol=TOL)
    assert all(t[1] is None for t in lstm_terms(x, s, w, False).values())


def test_what_the_core_declares() -> None:
    """Two H-wide vectors per layer, [h, c] (``h<layer>``, ``c<layer>``), W_hh's row blocks in PyTorch's order
    i, f, g, o, nn.LSTM fused; the readout is the top layer's h, not its c."""
    assert (LSTMCore.name, LSTMCore.fused, LSTMCore.state_factor) == ("lstm", nn.LSTM, 2)
    assert LSTMCore.gates == ("i", "f", "g", "o") and LSTMCore.gate_names == ("forget", "i", "f", "g", "o")
    assert LSTMCore.Config is LSTMConfig and LSTMConfig() == LSTMConfig()
    torch.manual_seed(0)
    core = LSTMCore(IN, H, 2).double()
    assert core.rnn.batch_first and core.layer_state == 2 * H and core.state_dim == 4 * H
    assert core.state_layout() == {"h1": slice(0, H), "c1": slice(H, 2 * H),
                                   "h2": slice(2 * H, 3 * H), "c2": slice(3 * H, 4 * H)}
    x, z = point()
    z = torch.cat([z, z.flip(-1)], dim=-1)  # (B, 4H)
    assert torch.equal(core.readout(x, z), z[:, 2 * H:3 * H])
