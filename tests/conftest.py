"""Shared fixtures: small configs and a CLI runner that separates stdout and stderr."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.models import core_class

torch.set_num_threads(1)  # the suite shares 2 cores with whatever else runs; 1 thread is faster here


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


def small_run(core: str = "gru", pe: str = "none", iterations: int = 20, **task: object) -> RunConfig:
    """A run that trains in well under a second."""
    task_cfg = TaskConfig(**{"name": "reverse", "vocab_size": 8, "length": 4, "heldout_size": 64,
                             "distribution": "dual", "grid_per_cell": 2, **task})
    return RunConfig(
        model=ModelConfig(core=core, vocab_size=task_cfg.vocab_size, embed_size=8, hidden_size=16, pe=pe,
                          max_len=16, core_config=dict(core_class(core).tiny_config)),
        task=task_cfg,
        train=TrainConfig(iterations=iterations, batch_size=16, lr=1e-2, warmup=3, checkpoint_every=5,
                          log_every=5, seed=7),
    )


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small real runs (dual GRU with checkpoints every 10 steps, uniform GRU, dual S4D, dual LSTM)."""
    from gradscope.train import train
    base = tmp_path_factory.mktemp("runs")
    runs = {
        "gru": small_run("gru", iterations=30),
        "gru-uniform": small_run("gru", iterations=10, distribution="uniform"),
        "s4d": small_run("s4d", pe="sinusoidal", iterations=10),
        "lstm": small_run("lstm", pe="sinusoidal", iterations=10),
    }
    for name, cfg in runs.items():
        if name == "gru":
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, checkpoint_every=10))
        train(cfg, base / name)
    return {name: base / name for name in runs}


def logged_iteration(run: Path) -> int:
    """The last iteration in a run's metrics.jsonl (0 if none yet; a line being written is skipped)."""
    last = 0
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    for line in lines:
        try:
            last = json.loads(line)["iteration"]
        except (json.JSONDecodeError, KeyError):
            pass
    return last


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    """The hardening suite's mutation counts (issue #15), per family and in all."""
    from fuzzkit import MUTATIONS
    if MUTATIONS:
        terminalreporter.write_line(f"hardening: {sum(MUTATIONS.values())} mutations tried "
                                    f"({', '.join(f'{k} {v}' for k, v in sorted(MUTATIONS.items()))})")
