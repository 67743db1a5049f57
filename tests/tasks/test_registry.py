"""Adding a task family or a PE kind is one registry line each: a task (recall in input order) and a PE
kind (a constant ramp) written here configure, train from the CLI and are probed by stability."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn


def test_a_task_and_a_pe_kind_are_one_registry_line_each(monkeypatch: pytest.MonkeyPatch, runner, tmp_path) -> None:
    """A task (recall in input order) and a PE kind (a constant ramp) written here are registered with
    one line each, then configure, train from the CLI and are probed by stability (the task says it
    has an input phase followed by queries)."""
    from gradscope.cli.app import app
    from gradscope.config import TaskConfig
    from gradscope.models.pe import PE_TYPES
    from gradscope.tasks import make_task
    from gradscope.tasks.registry import TASKS, probe_tasks
    from gradscope.tasks.reverse import Reverse

    class Repeat(Reverse):
        name = "repeat"

        def recall(self, x: Tensor) -> Tensor:
            return x

    class RampPE(nn.Module):
        name = "ramp"

        def __init__(self, dim: int) -> None:
            super().__init__()
            self.dim = dim

        @classmethod
        def build(cls, dim: int, max_len: int) -> "RampPE":
            return cls(dim)

        @staticmethod
        def numbers(dim: int, max_len: int) -> int:
            return 0

        def forward(self, length: int) -> Tensor:
            return torch.linspace(0, 1, length)[:, None].expand(length, self.dim)

    monkeypatch.setitem(TASKS, "repeat", Repeat)  # the task's one registry line
    monkeypatch.setitem(PE_TYPES, "ramp", RampPE)  # the PE kind's one registry line
    assert "repeat" in probe_tasks()
    batch = make_task(TaskConfig(name="repeat", vocab_size=5, length=3)).sample(4, torch.Generator().manual_seed(0))
    assert torch.equal(batch.targets[:, 3:], batch.inputs[:, :3])  # exact token ids
    run = tmp_path / "run"
    done = runner.invoke(app, ["train", "--task", "repeat", "--pe", "ramp", "--vocab-size", "6", "--length", "4", "--embed-size",
                               "4", "--hidden-size", "6", "--iterations", "10", "--checkpoint-every", "10", "--heldout-size", "32",
                               "--grid-per-cell", "2", "--batch-size", "8", "-q", "-o", str(run)])
    assert done.exit_code == 0, done.stderr
    st = runner.invoke(app, ["stability", str(run), "-o", str(tmp_path / "st.zarr"), "-q", "--triplets", "4",
                             "--resamples", "100"])
    assert st.exit_code == 0, st.stderr
    bad = runner.invoke(app, ["train", "--task", "nope", "-o", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "repeat" in bad.stderr  # the error lists the registry, the new task included
