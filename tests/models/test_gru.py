"""The GRU core (gradscope/models/gru.py) on its own: its functional cell (PyTorch's gate order r, z, n) against
torch.nn.GRUCell with the same weights, its analytic cell Jacobian and VJP against torch.func.jacrev of that cell,
and the input parts of its gate terms against each gate's own path, all in float64. The registry-wide contract
(tests/project/test_contracts.py) and the whole-core tests (tests/models/test_core.py, tests/models/test_rnn.py:
the terms' state parts) run it as every core; this file checks the cell functions themselves."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import Tensor, nn

from tests.helpers import cells
from tests.helpers.cells import F64, H, IN, TOL, cell_jacrev, load_torch_cell, check_jacobian, check_vjp
from gradscope.models.gru import GRUConfig, GRUCore, gru_cell, gru_jacobian, gru_terms, gru_vjp

GATES, WIDTH = 3, H  # gate blocks of W_hh; the layer state's width

weights = partial(cells.weights, GATES)  # (W_ih, W_hh, b_ih, b_hh), float64, seeded
point = partial(cells.point, WIDTH)  # x (B, in) and a layer state
jacrev = partial(cell_jacrev, gru_cell)  # the oracle: the cell's (∂s'/∂s, ∂s'/∂x) by torch.func


def test_the_cell_is_torch_gru_cell() -> None:
    w = weights()
    ref = load_torch_cell(nn.GRUCell(IN, H, dtype=F64), w)
    x, h = point()
    out, state = gru_cell(x, h, *w)
    with torch.no_grad():
        expected = ref(x, h)
    torch.testing.assert_close(state, expected, rtol=0, atol=TOL)
    assert torch.equal(out, state)


@pytest.mark.parametrize("need_input", [False, True])
def test_the_cell_jacobian_is_jacrev_of_the_cell(need_input: bool) -> None:
    check_jacobian(gru_jacobian, gru_cell, weights(), WIDTH, need_input)


@pytest.mark.parametrize("need_input", [False, True])
def test_the_cell_vjp_is_rows_times_the_jacobian(need_input: bool) -> None:
    """Rows g on h' → g · ∂h'/∂h written into ``out``, and g · ∂h'/∂x returned when asked."""
    check_vjp(gru_vjp, gru_cell, weights(), WIDTH, need_input)


def test_each_terms_input_part_is_its_gates_own_path() -> None:
    """Feed x to each gate's pre-activation as a separate argument (r, u, n): the derivative with respect to
    that argument alone, at all arguments equal to x, is that gate's input part; ``carry`` (u ⊙ h) reads no
    input. The input parts sum to ∂h'/∂x and the state parts to ∂h'/∂h."""
    w_ih, w_hh, b_ih, b_hh = w = weights()
    x, h = point()

    def paths(x_r: Tensor, x_u: Tensor, x_n: Tensor, h1: Tensor) -> Tensor:
        gh = (h1 @ w_hh.T + b_hh).chunk(3, dim=-1)
        r = torch.sigmoid(x_r @ w_ih[:H].T + b_ih[:H] + gh[0])
        u = torch.sigmoid(x_u @ w_ih[H:2 * H].T + b_ih[H:2 * H] + gh[1])
        n = torch.tanh(x_n @ w_ih[2 * H:].T + b_ih[2 * H:] + r * gh[2])
        return (1 - u) * n + u * h1

    ref = torch.func.vmap(torch.func.jacrev(paths, argnums=(0, 1, 2)))(x, x, x, h)  # 3 × (B, H, in)
    terms = gru_terms(x, h, w, True)
    assert tuple(terms) == GRUCore.gate_names
    assert terms["carry"][1] is None
    for name, jac in zip(("r", "u", "n"), ref):
        torch.testing.assert_close(terms[name][1], jac, rtol=0, atol=TOL, msg=name)
        assert jac.abs().max() > 1e-3, name
    j_h, j_x = gru_jacobian(x, h, w, True)
    torch.testing.assert_close(sum(t[1] for t in terms.values() if t[1] is not None), j_x, rtol=0, atol=TOL)
    torch.testing.assert_close(sum(t[0] for t in terms.values()), j_h, rtol=0, atol=TOL)
    assert all(t[1] is None for t in gru_terms(x, h, w, False).values())


def test_what_the_core_declares() -> None:
    """One H-wide state per layer; W_hh's row blocks in PyTorch's order r, z (here u), n; nn.GRU fused."""
    assert (GRUCore.name, GRUCore.fused, GRUCore.state_factor) == ("gru", nn.GRU, 1)
    assert GRUCore.gates == ("r", "u", "n") and GRUCore.gate_names == ("carry", "r", "u", "n")
    assert GRUCore.Config is GRUConfig and GRUConfig() == GRUConfig()
    torch.manual_seed(0)
    core = GRUCore(IN, H, 2)
    assert core.rnn.batch_first and core.state_dim == 2 * H
    assert core.state_layout() == {"h1": slice(0, H), "h2": slice(H, 2 * H)}
