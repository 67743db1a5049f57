"""The task registry: name → task class. Each class declares its name, whether stability probes are
defined on it and the checks of its own settings, so this dict drives config validation, the
training CLI's choices and which tasks stability and dynamics accept. Adding a task = one file with
its class + one line here + one test."""

from __future__ import annotations

from typing import Any

from gradscope.errors import GradscopeError, check
from gradscope.tasks.base import OPTIONAL_SETTINGS, Task
from gradscope.tasks.copy import Copy
from gradscope.tasks.delayed_sum import DelayedSum
from gradscope.tasks.lm import LanguageModel
from gradscope.tasks.mqar import MQAR
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
    "mqar": MQAR,
}

# task names of stores that are read as a registered family without being one: the raw-text path
# (`gradscope accuracy --text`, task "text", gradscope/workflows/text/accuracy.py) stores the lm family's part
READ_AS: dict[str, str] = {"text": "lm"}


def family_of(name: object) -> type[Task] | None:
    """The registered family a store's task ``name`` is read as (None: none)."""
    if not isinstance(name, str):
        return None
    return TASKS[name] if name in TASKS else TASKS.get(READ_AS.get(name, ""))


def probe_tasks() -> tuple[str, ...]:
    """The registered tasks on which stability and dynamics probes are defined (an input phase
    followed by query tokens)."""
    return tuple(name for name, cls in TASKS.items() if cls.probes)


def check_settings(task: str, given: dict[str, Any], distribution: str) -> None:
    """Refuse a given task setting (``given``: TaskConfig field → value) that task ``task`` does not
    read (its ``settings``), or that only the dual distribution reads while ``distribution`` is
    another: it would be recorded in config.json and ignored. ``distribution = "uniform"`` on a task
    with one frequency class states what it does and is accepted."""
    uses = TASKS[task].settings
    for field in OPTIONAL_SETTINGS:
        if field not in given or field in uses or (field == "distribution" and given[field] == "uniform"):
            continue
        where = [n for n, cls in TASKS.items() if field in cls.settings]
        raise GradscopeError(f"{field}: the {task} task has no {field} setting (it applies to {', '.join(where)}); "
                             f"leave it out")
    if "distribution" in uses and distribution != "dual":
        for field in ("rarity", "grid_per_cell"):
            check(field not in given, f"{field}: it applies to the dual distribution; this run's is {distribution} "
                                      f"(set distribution dual, or leave {field} out)")
