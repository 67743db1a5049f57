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
