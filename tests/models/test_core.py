"""Step Jacobians J_t = ∂z_t/∂z_{t−1} and their gate decomposition (SPEC §7) for every registered core,
against float64 autograd, and the generic torch.func forms a core without its own methods gets. The closed
forms of each core's terms are in tests/models/test_rnn.py and tests/models/test_s4d.py."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from gradscope.models import CORES

from tests.helpers.cores import tiny_core
from gradscope.models.core import Core, gate_terms, generic_step_jacobian, step_jacobian

IN, H, B = 4, 5, 3
TOL = 1e-12


def _core(name: str, layers: int, seed: int = 0) -> Core:
    """A float64 core with Jacobians far from tiny (tests/helpers/cores.py: W_hh scaled by 3; S4D's large dt)."""
    return tiny_core(name, IN, H, layers, seed=seed)


def _point(core: Core, seed: int = 1) -> tuple[Tensor, Tensor]:
    """x (B, in) and a random state z (B, D): every part nonzero, the LSTM's c included."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, IN, generator=gen, dtype=torch.float64)
    z = torch.randn(B, core.state_dim, generator=gen, dtype=torch.float64)
    return x, z


def _autograd(core: nn.Module, x: Tensor, z: Tensor) -> Tensor:
    """The oracle: torch.autograd.functional.jacobian of the step, batch diagonal kept → (B, D, D)."""
    full = torch.autograd.functional.jacobian(lambda z_: core.step(x, z_)[1], z)  # (B, D, B, D)
    return torch.stack([full[b, :, b] for b in range(z.shape[0])])


def _err(t: Tensor) -> float:
    """max |t| as a float (detached: the Jacobians carry the weights' graph)."""
    return float(t.detach().abs().max())


CASES = [(name, layers) for name in CORES for layers in (1, 2, 3)]  # 3: chains through two lower layers


@pytest.mark.parametrize("name,layers", CASES)
def test_step_jacobian_matches_autograd(name: str, layers: int) -> None:
    core = _core(name, layers)
    x, z = _point(core)
    J = core.step_jacobian(x, z)
    assert J.shape == (B, core.state_dim, core.state_dim) and J.dtype == torch.float64
    expected = _autograd(core, x, z)
    assert _err(J - expected) <= TOL
    assert _err(expected) > 0.1  # not a vacuous comparison
    if layers == 2:  # the upper layer reads the lower one's new state: a nonzero block below the diagonal
        half = core.state_dim // 2
        assert _err(J[:, half:, :half]) > 1e-3
    # the generic torch.func fallback (Core's default) agrees too
    assert _err(generic_step_jacobian(core, x, z) - expected) <= TOL
    assert _err(step_jacobian(core, x, z) - J) == 0.0


@pytest.mark.parametrize("name,layers", CASES)
def test_gate_terms_sum_to_step_jacobian(name: str, layers: int) -> None:
    core = _core(name, layers)
    x, z = _point(core)
    terms = core.gate_terms(x, z)
    assert tuple(terms) == type(core).gate_names
    for key, term in terms.items():
        assert term.shape == (B, core.state_dim, core.state_dim), key
        assert _err(term) > 1e-3, f"term {key!r} is zero"
    assert _err(sum(terms.values()) - core.step_jacobian(x, z)) <= TOL
    assert tuple(gate_terms(core, x, z)) == tuple(terms)


class _UserCell(nn.Module):
    """A protocol core that is not a gradscope Core: z' = tanh(W z + V x), no step_jacobian method."""

    state_dim, out_dim = 4, 4

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.W = nn.Parameter(2 * torch.randn(4, 4, generator=gen, dtype=torch.float64))
        self.V = nn.Parameter(torch.randn(4, IN, generator=gen, dtype=torch.float64))

    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        h = torch.tanh(z @ self.W.T + x @ self.V.T)
        return h, h


def test_protocol_core_without_the_methods_gets_the_generic_jacobian() -> None:
    core = _UserCell()
    x, z = _point(core)  # type: ignore[arg-type]
    h_new = core.step(x, z)[1]
    expected = (1 - h_new ** 2)[:, :, None] * core.W
    assert _err(step_jacobian(core, x, z) - expected) <= TOL
    terms = gate_terms(core, x, z)
    assert list(terms) == ["step"] and _err(terms["step"] - expected) <= TOL
