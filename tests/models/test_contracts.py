"""Every registered core meets the one contract (tests/helpers/contracts.py): no core is named here."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradscope.models import CORES
from tests.helpers.contracts import check_core


@pytest.mark.parametrize("name", list(CORES))
def test_every_registered_core_meets_the_contract(name: str, tmp_path: Path) -> None:
    check_core(name, tmp_path)


def test_the_contract_fails_a_core_whose_step_jacobian_is_wrong(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The contract can fail: a registered core whose analytic step Jacobian is off by a factor."""
    base = CORES[next(iter(CORES))]

    class Broken(base):  # type: ignore[valid-type, misc]
        def step_jacobian(self, *args):  # noqa: ANN002, ANN201
            return 2 * super().step_jacobian(*args)

    monkeypatch.setitem(CORES, "broken", Broken)
    with pytest.raises(AssertionError):
        check_core("broken", tmp_path)
