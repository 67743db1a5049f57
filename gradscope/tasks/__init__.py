"""Synthetic tasks (docs/definitions.md §3): vectorised batch makers taking an explicit ``torch.Generator``."""

from __future__ import annotations

from gradscope.tasks.base import IGNORE, Batch, Task
from gradscope.tasks.copy import Copy
from gradscope.tasks.delayed_sum import DelayedSum
from gradscope.tasks.fields import TaskFields
from gradscope.tasks.heldout import (Excluder, HeldOut, build_grid, build_heldout, grid_batch, row_hash,
                                     sample_excluding, sample_unique, supports_grid)
from gradscope.tasks.predecessor import Predecessor
from gradscope.tasks.reverse import Reverse
from gradscope.tasks.reverse_variable import ReverseVariable
from gradscope.tasks.sort import Sort
from gradscope.tasks.registry import TASKS, probe_tasks
from gradscope.tasks.vocab import FREQUENT, GROUP_NAMES, RARE, group_bounds, sample_group, sample_tokens


def make_task(cfg: TaskFields) -> Task:
    """The task object for ``cfg.name``."""
    return TASKS[cfg.name](cfg)


__all__ = ["FREQUENT", "GROUP_NAMES", "IGNORE", "RARE", "Batch", "Copy", "DelayedSum", "Excluder",
           "HeldOut", "Predecessor", "Reverse", "ReverseVariable", "Sort", "Task", "build_grid", "build_heldout",
           "grid_batch", "group_bounds", "make_task", "row_hash", "sample_excluding", "sample_group",
           "sample_tokens", "sample_unique", "supports_grid", "TASKS", "probe_tasks"]
