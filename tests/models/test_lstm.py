"""The LSTM core (gradscope/models/lstm.py) on its own: its functional cell on [h, c] (PyTorch's gate order i, f,
g, o) against torch.nn.LSTMCell with the same weights, its analytic cell Jacobian and VJP against torch.func.jacrev
of that cell, and the input parts of its gate terms against each gate's own path, all in float64. The
registry-wide contract (tests/project/test_contracts.py) and the whole-core tests (tests/models/test_core.py,
tests/models/test_rnn.py: the terms' state parts) run it as every core; this file checks the cell functions."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import Tensor, nn

from tests.helpers import cells
from tests.helpers.cells import B, F64, H, IN, TOL, cell_jacrev, load_torch_cell, check_jacobian, check_vjp
from gradscope.models.lstm import LSTMConfig, LSTMCore, lstm_cell, lstm_jacobian, lstm_terms, lstm_vjp

GATES, WIDTH = 4, 2 * H  # gate blocks of W_hh; the layer state's width

weights = partial(cells.weights, GATES)  # (W_ih, W_hh, b_ih, b_hh), float64, seeded
point = partial(cells.point, WIDTH)  # x (B, in) and a layer state
jacrev = partial(cell_jacrev, lstm_cell)  # the oracle: the cell's (∂s'/∂s, ∂s'/∂x) by torch.func


def test_the_cell_is_torch_lstm_cell() -> None:
    """The output is h'; the new layer state is [h', c'], as nn.LSTMCell's (h', c')."""
    w = weights()
    ref = load_torch_cell(nn.LSTMCell(IN, H, dtype=F64), w)
    x, s = point()
    out, state = lstm_cell(x, s, *w)
    with torch.no_grad():
        h_ref, c_ref = ref(x, (s[:, :H], s[:, H:]))
    assert state.shape == (B, 2 * H)
    torch.testing.assert_close(state, torch.cat([h_ref, c_ref], dim=-1), rtol=0, atol=TOL)
    assert torch.equal(out, state[:, :H])


@pytest.mark.parametrize("need_input", [False, True])
def test_the_cell_jacobian_is_jacrev_of_the_cell(need_input: bool) -> None:
    ref_s, _ = check_jacobian(lstm_jacobian, lstm_cell, weights(), WIDTH, need_input)
    assert ref_s[:, :, H:].abs().max() > 0.1  # the c columns too


@pytest.mark.parametrize("need_input", [False, True])
def test_the_cell_vjp_is_rows_times_the_jacobian(need_input: bool) -> None:
    """Rows g on [h', c'] → g · ∂[h', c']/∂[h, c] written into ``out``; g · ∂[h', c']/∂x returned when
    asked."""
    check_vjp(lstm_vjp, lstm_cell, weights(), WIDTH, need_input)


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
