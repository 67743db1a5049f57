"""The Elman core (gradscope/models/elman.py) on its own: its functional cell against torch.nn.RNNCell with the
same weights, its analytic cell Jacobian and VJP against torch.func.jacrev of that cell, all in float64. The
registry-wide contract (tests/project/test_contracts.py) and the whole-core step Jacobians (tests/models/test_core.py,
tests/models/test_rnn.py) run it as every core; this file checks the cell functions themselves, input part included."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from gradscope.models.elman import ElmanConfig, ElmanCore, elman_cell, elman_jacobian, elman_terms, elman_vjp

F64 = torch.float64
IN, H, B, R = 3, 4, 2, 5
TOL = 1e-12


def weights(seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(W_ih (H, in), W_hh (H, H), b_ih (H), b_hh (H)), W_hh at gain 2 so tanh is away from linear."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(H, IN, generator=gen, dtype=F64), 2 * torch.randn(H, H, generator=gen, dtype=F64) / H ** 0.5,
            torch.randn(H, generator=gen, dtype=F64), torch.randn(H, generator=gen, dtype=F64))


def point(seed: int = 1) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, IN, generator=gen, dtype=F64), torch.randn(B, H, generator=gen, dtype=F64)


def jacrev(x: Tensor, h: Tensor, w: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """The oracle: (∂h'/∂h (B, H, H), ∂h'/∂x (B, H, in)) of the cell by torch.func, per sequence."""
    def one(x1: Tensor, h1: Tensor) -> Tensor:
        return elman_cell(x1[None], h1[None], *w)[1][0]
    j_x, j_h = torch.func.vmap(torch.func.jacrev(one, argnums=(0, 1)))(x, h)
    return j_h, j_x


def test_the_cell_is_torch_rnn_cell() -> None:
    w = weights()
    ref = nn.RNNCell(IN, H, nonlinearity="tanh", dtype=F64)
    with torch.no_grad():
        for p, v in zip((ref.weight_ih, ref.weight_hh, ref.bias_ih, ref.bias_hh), w):
            p.copy_(v)
    x, h = point()
    out, state = elman_cell(x, h, *w)
    with torch.no_grad():
        expected = ref(x, h)
    torch.testing.assert_close(state, expected, rtol=0, atol=TOL)
    assert torch.equal(out, state)  # the output is the new state


@pytest.mark.parametrize("need_input", [False, True])
def test_the_cell_jacobian_is_jacrev_of_the_cell(need_input: bool) -> None:
    w = weights()
    x, h = point()
    j_h, j_x = elman_jacobian(x, h, w, need_input)
    ref_h, ref_x = jacrev(x, h, w)
    assert j_h.shape == (B, H, H)
    torch.testing.assert_close(j_h, ref_h, rtol=0, atol=TOL)
    if need_input:
        assert j_x is not None and j_x.shape == (B, H, IN)
        torch.testing.assert_close(j_x, ref_x, rtol=0, atol=TOL)
    else:
        assert j_x is None
    assert ref_h.abs().max() > 0.1 and ref_x.abs().max() > 0.1  # not a vacuous comparison


@pytest.mark.parametrize("need_input", [False, True])
def test_the_cell_vjp_is_rows_times_the_jacobian(need_input: bool) -> None:
    """Rows g on h' → g · ∂h'/∂h written into ``out``, and g · ∂h'/∂x returned when asked."""
    w = weights()
    x, h = point()
    g = torch.randn(B, R, H, generator=torch.Generator().manual_seed(2), dtype=F64)
    out = torch.full((B, R, H), float("nan"), dtype=F64)
    rows_x = elman_vjp(x, h, w, g.clone(), out, need_input)  # g: a spent buffer it may overwrite
    ref_h, ref_x = jacrev(x, h, w)
    torch.testing.assert_close(out, g @ ref_h, rtol=0, atol=TOL)
    if need_input:
        assert rows_x is not None
        torch.testing.assert_close(rows_x, g @ ref_x, rtol=0, atol=TOL)
    else:
        assert rows_x is None


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
