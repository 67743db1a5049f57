"""The Elman core (gradscope/models/elman.py) on its own: its functional cell against torch.nn.RNNCell with the
same weights, its analytic cell Jacobian and VJP against torch.func.jacrev of that cell, all in float64. The
registry-wide contract (tests/project/test_contracts.py) and the whole-core step Jacobians (tests/models/test_core.py,
tests/models/test_rnn.py) run it as every core; this file checks the cell functions themselves, input part included."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from tests.helpers import cells
from tests.helpers.cells import F64, H, IN, TOL, cell_jacrev, load_torch_cell, check_jacobian, check_vjp
from gradscope.models.elman import ElmanConfig, ElmanCore, elman_cell, elman_jacobian, elman_terms, elman_vjp

GATES, WIDTH = 1, H  # gate blocks of W_hh; the layer state's width

weights = partial(cells.weights, GATES)  # (W_ih, W_hh, b_ih, b_hh), float64, seeded
point = partial(cells.point, WIDTH)  # x (B, in) and a layer state
jacrev = partial(cell_jacrev, elman_cell)  # the oracle: the cell's (∂s'/∂s, ∂s'/∂x) by torch.func


def test_the_cell_is_torch_rnn_cell() -> None:
    w = weights()
    ref = load_torch_cell(nn.RNNCell(IN, H, nonlinearity="tanh", dtype=F64), w)
    x, h = point()
    out, state = elman_cell(x, h, *w)
    with torch.no_grad():
        expected = ref(x, h)
    torch.testing.assert_close(state, expected, rtol=0, atol=TOL)
    assert torch.equal(out, state)  # the output is the new state


@pytest.mark.parametrize("need_input", [False, True])
def test_the_cell_jacobian_is_jacrev_of_the_cell(need_input: bool) -> None:
    check_jacobian(elman_jacobian, elman_cell, weights(), WIDTH, need_input)


@pytest.mark.parametrize("need_input", [False, True])
def test_the_cell_vjp_is_rows_times_the_jacobian(need_input: bool) -> None:
    """Rows g on h' → g · ∂h'/∂h written into ``out``, and g · ∂h'/∂x returned when asked."""
    check_vjp(elman_vjp, elman_cell, weights(), WIDTH, need_input)


def test_the_one_term_is_the_whole_cell_jacobian() -> None:
    """One path, ``h``: its state and input parts are the cell Jacobian's, exactly."""
    w = weights()
    x, h = point()
    terms = elman_terms(x, h, w, True)
    assert list(terms) == ["h"]
    j_h, j_x = elman_jacobian(x, h, w, True)
    assert torch.equal(terms["h"][0], j_h) and torch.equal(terms["h"][1], j_x)


def test_what_the_core_declares() -> None:
    """One H-wide state per layer (``h<layer>``), one gate block of W_hh, the fused module nn.RNN (tanh)."""
    assert (ElmanCore.name, ElmanCore.fused, ElmanCore.state_factor) == ("elman", nn.RNN, 1)
    assert ElmanCore.gates == ElmanCore.gate_names == ("h",)
    assert ElmanCore.Config is ElmanConfig and ElmanConfig() == ElmanConfig()
    torch.manual_seed(0)
    core = ElmanCore(IN, H, 2)
    assert core.rnn.nonlinearity == "tanh" and core.rnn.batch_first
    assert core.state_dim == 2 * H
    assert core.state_layout() == {"h1": slice(0, H), "h2": slice(H, 2 * H)}
