"""The task's frozen configuration (as ModelConfig lives in models/config.py): the fields of
:class:`~gradscope.tasks.fields.TaskFields`, checked against the task registry as well, so an unknown
task name and the settings only one task reads (``Task.check_config``) are refused on construction."""

from __future__ import annotations

from dataclasses import dataclass

from gradscope.fields import text
from gradscope.tasks.fields import DISTRIBUTIONS, MAX_LENGTH, TaskFields
from gradscope.tasks.registry import TASKS

__all__ = ["DISTRIBUTIONS", "MAX_LENGTH", "TaskConfig"]


@dataclass(frozen=True, kw_only=True)
class TaskConfig(TaskFields):
    """A synthetic task (docs/definitions.md §3): its fields (:class:`TaskFields`, where each is described),
    checked as a whole on construction."""

    def __post_init__(self) -> None:
        text("task", self.name, list(TASKS))  # first: an unknown name is the error reported
        super().__post_init__()
        TASKS[self.name].check_config(self)  # the settings only this task uses
