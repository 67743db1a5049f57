"""The price of a core's own (hand-derived) products: the general factors, or the one the core declares."""

from __future__ import annotations

import pytest
from torch import nn

from gradscope.analysis.cost import OWN_FACTOR, products_seconds
from gradscope.models.core import own_cost, own_products


class _Own(nn.Module):
    own_cost = {"vjp": 0.07, "other": 9.0}

    def step_cotangents(self, x, z, gz, t=None):  # noqa: ANN001, ANN201 - only its presence counts here
        return gz


@pytest.mark.parametrize("kind", ["jvp", "vjp"])
def test_own_products_are_priced_by_the_general_or_the_declared_factor(kind: str) -> None:
    args = dict(D=200_000, modules=300, params=9e7, step_flops=1.8e8)  # one VJP chunk either way
    generic = products_seconds(kind, 10, 16, **args)
    assert products_seconds(kind, 10, 16, own=True, **args) == pytest.approx(generic * OWN_FACTOR[kind])
    assert products_seconds(kind, 10, 16, own=True, own_factor=0.07, **args) == pytest.approx(generic * 0.07)
    assert products_seconds(kind, 10, 16, own_factor=0.07, **args) == pytest.approx(generic)  # not its own: generic


def test_a_core_declares_factors_only_for_products_it_has() -> None:
    core = _Own()
    assert own_products(core) == frozenset({"vjp"})
    assert own_cost(core) == {"vjp": 0.07}  # no step_tangents: its "jvp" would not count; unknown kinds dropped
    assert own_cost(nn.Linear(2, 2)) == {}


class _Chain(nn.Module):
    """A core whose own chain_tangents (a span of steps at once) declares the factor ``chain``."""

    state_dim, out_dim = 50_000, 64

    def __init__(self, chain: float | None) -> None:
        super().__init__()
        self.lin = nn.Linear(256, 256)
        if chain is not None:
            self.own_cost = {"chain": chain}

    def chain_tangents(self, x, z, dz, t=None):  # noqa: ANN001, ANN201 - only its presence counts here
        return x, dz


def test_a_core_with_its_own_chain_scales_the_sketch_tangents_by_its_factor() -> None:
    """The sketch's price is the primal's flops plus the tangent chain's (flops and products); a core with
    its own ``chain_tangents`` that declares "chain" scales the second part only, and without the factor
    (or at 1) it is priced as any core."""
    from gradscope.analysis.stability import plan_stability

    def price(chain: float | None) -> float:
        plan = plan_stability(_Chain(chain), 96, 32, 1, estimator="sketch", units=4)
        assert plan.estimator == "sketch"
        return plan.seconds

    assert own_products(_Chain(0.5)) == frozenset({"chain"})
    primal, half, whole = price(0.0), price(0.5), price(1.0)
    assert primal > 0 and whole > primal
    assert half - primal == pytest.approx(0.5 * (whole - primal))
    assert price(None) == pytest.approx(whole)
