"""The options task families add to `stability`, `dynamics` and `accuracy`, declared on each family: one
frozen dataclass per family with options of its own (``lm_options.py``), and one base line in
:class:`FamilyOptions`, their union, which each command's options class inherits (workflows/options.py,
which names no family's option). A family's evaluation and probe source say which of them they read
(families/lm.py); one given for a checkpoint of another family is refused (families/registry.py), and a
source without a family (a model in memory, a factory, a text) refuses them all (workflows/sources.py).
Torch-free."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gradscope.workflows.families.lm_options import LMOptions


@dataclass(frozen=True, kw_only=True)
class FamilyOptions(LMOptions):  # one base per family with options of its own
    """Every family's own options. Each command's ``__post_init__`` calls this one (before its own range checks):
    the checks of each family that has any."""

    def __post_init__(self) -> None:
        for base in FamilyOptions.__bases__:
            own = getattr(base, "__post_init__", None)
            if own is not None:
                own(self)


def option_names(cls: type) -> tuple[str, ...]:
    """The field names of options class ``cls`` (a family's, or :class:`FamilyOptions`: every family's)."""
    return tuple(f.name for f in dataclasses.fields(cls))


FAMILY_OPTIONS = option_names(FamilyOptions)  # every option some family declares as its own
