"""Fixtures of the file-format tests: real small checkpoints to mutate (gradscope's format and the
paper's) and a run stopped before its end, to resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.hardening import checkpoint_sources, record_field_paths, stopped_run


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name → checkpoint file. ``gru`` lies in a run directory stopped at 10 of 12 iterations."""
    return checkpoint_sources(tmp_path_factory)


@pytest.fixture(scope="module")
def field_paths(sources: dict[str, Path]) -> dict[str, list[tuple]]:
    """Every path into each source's checkpoint (``hardening.FIELD_PATHS``, which the strategies draw from)."""
    return record_field_paths(sources)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 12 iterations stopped at 10 (checkpoints at 5 and 10, log lines at 5 and 10)."""
    return stopped_run(tmp_path_factory)
