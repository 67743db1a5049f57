"""Shared fixtures: small configs and a CLI runner that separates stdout and stderr."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.helpers.runs import COMPLEX_CORE, DEFAULT_CORE, OTHER_CORE, small_run

torch.set_num_threads(1)  # the suite shares 2 cores with whatever else runs; 1 thread is faster here
# plans priced at the reference CPU's rates, never this machine's of the moment (gradscope.rates): the same
# plan on every machine and under any load, so the tests of plans and budgets are deterministic
os.environ["GRADSCOPE_RATES"] = "reference"


@pytest.fixture(autouse=True, scope="module")
def _cached_command():  # noqa: ANN202
    """typer rebuilds the click command on every CliRunner.invoke (~0.25 s here); build it once."""
    import typer.testing
    real, cache = typer.testing._get_command, {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(typer.testing, "_get_command", lambda app: cache.setdefault(id(app), real(app)))
        yield


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small real runs, by role, of cores taken from the registry (tests/helpers/runs.py), never named:
    "dual" (the default core, dual frequency, checkpoints every 10 steps), "uniform" (the default core,
    uniform frequencies), "complex" (a complex-state core, sinusoidal PE) and "other" (a second gated
    core, sinusoidal PE)."""
    from gradscope.train import train
    base = tmp_path_factory.mktemp("runs")
    runs = {
        "dual": small_run(DEFAULT_CORE, iterations=30),
        "uniform": small_run(DEFAULT_CORE, iterations=10, distribution="uniform"),
        "complex": small_run(COMPLEX_CORE, pe="sinusoidal", iterations=10),
        "other": small_run(OTHER_CORE, pe="sinusoidal", iterations=10),
    }
    for name, cfg in runs.items():
        if name == "dual":
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, checkpoint_every=10))
        train(cfg, base / name)
    return {name: base / name for name in runs}


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    """The hardening suite's mutation counts (issue #15), per family and in all."""
    from tests.helpers.fuzzkit import MUTATIONS
    if MUTATIONS:
        terminalreporter.write_line(f"hardening: {sum(MUTATIONS.values())} mutations tried "
                                    f"({', '.join(f'{k} {v}' for k, v in sorted(MUTATIONS.items()))})")
