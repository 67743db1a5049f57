"""Fixtures of the store tests: small real stores, a run and a sweep (``storekit.built``, once per session),
with legacy versions and what they read as unmutated, and a private copy per test to mutate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.storefuzz import baseline_of, made_with_legacy
from tests.helpers.storekit import fresh


@pytest.fixture(scope="session")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The built inputs, and a legacy version of each store (``storefuzz.legacy``)."""
    return made_with_legacy(tmp_path_factory)


@pytest.fixture(scope="session")
def baseline(made: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the unmutated inputs read as: every store's values, each summary's numbers, the run's log."""
    return baseline_of(made, tmp_path_factory)


@pytest.fixture
def mine(made: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    """A private copy of the built inputs, to mutate."""
    return fresh(made["run"].parent, tmp_path / "in")
