"""How a checkpoint of each task family is evaluated: the half of a family that runs its model.

A family's evaluation runs its model and reads the analysis and store layers, which rank above
gradscope/tasks/ (docs/architecture.md), so the family's class cannot hold it. It lives here instead:
one module per family whose evaluation is its own (``lm.py``, ``reverse_continuous.py``) and one line
in :data:`EVALUATIONS`, keyed by the family's class. A family without a line (every token family,
mqar included) is evaluated by the default, ``tokens.py``: argmax predictions on its held-out set, its
own part through its ``score`` and ``accuracy_part``. gradscope/workflows/accuracy.py calls what
:func:`evaluation_of` gives and names no family.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gradscope.errors import GradscopeError
from gradscope.files.checkpoint import Loaded
from gradscope.tasks.base import Task
from gradscope.tasks.lm import LanguageModel
from gradscope.tasks.registry import TASKS
from gradscope.tasks.reverse_continuous import ReverseContinuous
from gradscope.workflows.families.evaluation import Evaluation
from gradscope.workflows.families.lm import LM
from gradscope.workflows.families.reverse_continuous import VECTORS
from gradscope.workflows.families.tokens import TOKENS
from gradscope.workflows.options import AccuracyOptions

def as_given(value: Any) -> str:
    """A value as a message shows it: a path as the text it was given as."""
    return repr(str(value)) if isinstance(value, Path) else repr(value)


EVALUATIONS: dict[type[Task], Evaluation] = {
    LanguageModel: LM,
    ReverseContinuous: VECTORS,
}


def evaluation_of(family: type[Task]) -> Evaluation:
    """The evaluation of ``family``: its own line in :data:`EVALUATIONS` (or its nearest base
    class's), else the token evaluation."""
    for cls in family.__mro__:
        if cls in EVALUATIONS:
            return EVALUATIONS[cls]
    return TOKENS


def text_families() -> list[str]:
    """The registered families whose probes are their corpus's own text (:attr:`Evaluation.text_probes`), by name:
    what a message names where an option applies to them only."""
    return [name for name, cls in TASKS.items() if evaluation_of(cls).text_probes is not None]


def check_probe_options(loaded: Loaded, opts: Any) -> None:
    """Refuse a stability or dynamics option (of ``opts``, set away from its default) that another family's probe
    source reads and ``loaded``'s family's does not (:attr:`TextProbes.options`): recorded and ignored otherwise."""
    own = evaluation_of(TASKS[loaded.config.task.name]).text_probes
    mine = set(own.options) if own is not None else set()
    readers: dict[str, list[str]] = {}
    for name, cls in TASKS.items():
        source = evaluation_of(cls).text_probes
        for option in source.options if source is not None else ():
            readers.setdefault(option, []).append(name)
    defaults = {f.name: f.default for f in dataclasses.fields(opts)}
    for option in sorted(set(readers) - mine):
        value = getattr(opts, option, defaults.get(option))
        if option in defaults and value != defaults[option]:
            raise GradscopeError(f"{option}: got {as_given(value)}, but {loaded.path} is a {loaded.config.task.name} "
                                 f"checkpoint; it applies to {', '.join(readers[option])} runs only (leave it out)")


def check_options(loaded: Loaded, opts: AccuracyOptions, evaluation: Evaluation) -> None:
    """Refuse an option given for ``loaded`` that another family's evaluation reads and its own does
    not (``grid=False``, skipping a grid, holds for every family)."""
    own = {o for e in (TOKENS, *EVALUATIONS.values()) for o in e.options}
    for field in dataclasses.fields(opts):
        value = getattr(opts, field.name)
        if field.name not in own or field.name in evaluation.options or value is False or value == field.default:
            continue
        where = [n for n, cls in TASKS.items() if field.name in evaluation_of(cls).options]
        raise GradscopeError(f"{field.name}: got {as_given(value)}, but {loaded.path} is a {loaded.config.task.name} "
                             f"checkpoint; it applies to {', '.join(where)} runs only (leave it out)")
