"""The GRU core (gradscope/models/gru.py) on its own: its functional cell (PyTorch's gate order r, z, n) against
torch.nn.GRUCell with the same weights, its analytic cell Jacobian and VJP against torch.func.jacrev of that cell,
and the input parts of its gate terms against each gate's own path, all in float64. The registry-wide contract
(tests/project/test_contracts.py) and the whole-core tests (tests/models/test_core.py, tests/models/test_rnn.py:
the terms' state parts) run it as every core; this file checks the cell functions themselves."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from gradscope.models.gru import GRUConfig, GRUCore, gru_cell, gru_jacobian, gru_terms, gru_vjp

F64 = torch.float64
IN, H, B, R = 3, 4, 2, 5
TOL = 1e-12


def weights(seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(W_ih (3H, in), W_hh (3H, H), b_ih (3H), b_hh (3H)), W_hh at gain 2 so every gate is away from linear."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(3 * H, IN, generator=gen, dtype=F64),
            2 * torch.randn(3 * H, H, generator=gen, dtype=F64) / H ** 0.5,
            torch.randn(3 * H, generator=gen, dtype=F64), torch.randn(3 * H, generator=gen, dtype=F64))


def point(seed: int = 1) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, IN, generator=gen, dtype=F64), torch.randn(B, H, generator=gen, dtype=F64)


def jacrev(x: Tensor, h: Tensor, w: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """The oracle: (∂h'/∂h (B, H, H), ∂h'/∂x (B, H, in)) of the cell by torch.func, per sequence."""
    def one(x1: Tensor, h1: Tensor) -> Tensor:
        return gru_cell(x1[None], h1[None], *w)[1][0]
    j_x, j_h = torch.func.vmap(torch.func.jacrev(one, argnums=(0, 1)))(x, h)
    return j_h, j_x


def test_the_cell_is_torch_gru_cell() -> None:
    w = weights()
    ref = nn.GRUCell(IN, H, dtype=F64)
    with torch.no_grad():
        for p, v in zip((ref.weight_ih, ref.weight_hh, ref.bias_ih, ref.bias_hh), w):
            p.copy_(v)
    x, h = point()
    out, state = gru_cell(x, h, *w)
    with torch.no_grad():
        expected = ref(x, h)
    torch.testing.assert_close(state, expected, rtol=0, atol=TOL)
    assert torch.equal(out, state)


@pytest.mark.parametrize("need_input", [False, True])
def test_the_cell_jacobian_is_jacrev_of_the_cell(need_input: bool) -> None:
    w = weights()
    x, h = point()
    j_h, j_x = gru_jacobian(x, h, w, need_input)
    ref_h, ref_x = jacrev(x, h, w)
    assert j_h.shape == (B, H, H)
    torch.testing.assert_close(j_h, ref_h, rtol=0, atol=TOL)
    if need_input:
        assert j_x is not None and j_x.shape == (B, H, IN)
        torch.testing.assert_close(j_x, ref_x, rtol=0, atol=TOL)
    else:
        assert j_x is None
    assert ref_h.abs().max() > 0.1 and ref_x.abs().max() > 0.1


@pytest.mark.parametrize("need_input", [False, True])
def test_the_cell_vjp_is_rows_times_the_jacobian(need_input: bool) -> None:
    """Rows g on h' → g · ∂h'/∂h written into ``out``, and g · ∂h'/∂x returned when asked."""
    w = weights()
    x, h = point()
    g = torch.randn(B, R, H, generator=torch.Generator().manual_seed(2), dtype=F64)
    out = torch.full((B, R, H), float("nan"), dtype=F64)
    rows_x = gru_vjp(x, h, w, g.clone(), out, need_input)
    ref_h, ref_x = jacrev(x, h, w)
    torch.testing.assert_close(out, g @ ref_h, rtol=0, atol=TOL)
    if need_input:
        assert rows_x is not None
        torch.testing.assert_close(rows_x, g @ ref_x, rtol=0, atol=TOL)
    else:
        assert rows_x is None


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
