"""gradscope.workflows.families.lm_options: the lm family's own option (where its corpus lies now) is declared
once, on the family; stability, dynamics and accuracy take it from there, and the family's evaluation and probe
source read it."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from gradscope.errors import GradscopeError
from gradscope.workflows.families.lm import LM
from gradscope.workflows.families.lm_options import CORPUS_HELP, LMOptions
from gradscope.workflows.options import AccuracyOptions, DynamicsOptions, StabilityOptions

COMMANDS = (StabilityOptions, DynamicsOptions, AccuracyOptions)


def test_the_corpus_option_is_a_path_or_none() -> None:
    assert LMOptions().corpus is None
    assert LMOptions(corpus="moved/wt").corpus == Path("moved/wt")
    assert LMOptions(corpus=Path("w")).corpus == Path("w")
    with pytest.raises(GradscopeError, match="corpus: got int; expected a path"):
        LMOptions(corpus=3)


@pytest.mark.parametrize("cls", COMMANDS)
def test_each_command_takes_the_family_declaration_unchanged(cls: type) -> None:
    field = {f.name: f for f in dataclasses.fields(cls)}["corpus"]
    assert field.default is None and field.metadata["help"] == CORPUS_HELP
    own = inspect.get_annotations(cls)  # the class's own fields, not those it inherits
    assert own and "corpus" not in own, f"{cls.__name__} declares corpus again"
    assert cls(corpus="c").corpus == Path("c")  # every command's as a Path (accuracy's was a str)
    with pytest.raises(GradscopeError, match="corpus: got list; expected a path"):
        cls(corpus=["a"])


def test_the_family_reads_its_own_options() -> None:
    names = tuple(f.name for f in dataclasses.fields(LMOptions))
    assert LM.options == names
    assert LM.text_probes is not None and set(names) <= set(LM.text_probes.options)
