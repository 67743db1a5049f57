"""The task registry: name → task class. Each class declares its name, whether stability probes are
defined on it and the checks of its own settings, so this dict drives config validation, the
training CLI's choices and which tasks stability and dynamics accept. Adding a task = one file with
its class + one line here + one test."""

from __future__ import annotations

from gradscope.tasks.base import Task
from gradscope.tasks.copy import Copy
from gradscope.tasks.delayed_sum import DelayedSum
from gradscope.tasks.lm import LanguageModel
from gradscope.tasks.predecessor import Predecessor
from gradscope.tasks.reverse import Reverse
from gradscope.tasks.reverse_continuous import ReverseContinuous
from gradscope.tasks.reverse_variable import ReverseVariable
from gradscope.tasks.sort import Sort

TASKS: dict[str, type[Task]] = {
    "reverse": Reverse,
    "reverse-variable": ReverseVariable,
    "sort": Sort,
    "delayed-sum": DelayedSum,
    "predecessor": Predecessor,
    "copy": Copy,
    "reverse-continuous": ReverseContinuous,
    "lm": LanguageModel,
}


def probe_tasks() -> tuple[str, ...]:
    """The registered tasks on which stability and dynamics probes are defined (an input phase
    followed by query tokens)."""
    return tuple(name for name, cls in TASKS.items() if cls.probes)
