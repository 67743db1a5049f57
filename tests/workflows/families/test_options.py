"""gradscope.workflows.families.options: FamilyOptions is the union of every family's own options, each command's
options class inherits it and declares none of them again, and every option a family declares is read by that
family's evaluation or probe source (so none is declared and then ignored)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from gradscope.workflows.families.options import FAMILY_OPTIONS, FamilyOptions, option_names
from gradscope.workflows.families.registry import EVALUATIONS
from gradscope.workflows.options import AccuracyOptions, DynamicsOptions, StabilityOptions


def test_family_options_are_the_union_of_the_families_declarations() -> None:
    bases = FamilyOptions.__bases__
    assert bases and all(dataclasses.is_dataclass(b) for b in bases)
    union = [name for b in bases for name in option_names(b)]
    assert sorted(FAMILY_OPTIONS) == sorted(union) and len(set(union)) == len(union)  # no option in two families
    assert not inspect.get_annotations(FamilyOptions)  # it declares nothing of its own


@pytest.mark.parametrize("cls", [StabilityOptions, DynamicsOptions, AccuracyOptions])
def test_each_command_inherits_them_and_declares_none_again(cls: type) -> None:
    assert issubclass(cls, FamilyOptions)
    own = inspect.get_annotations(cls)
    assert own and not set(own) & set(FAMILY_OPTIONS)
    assert set(FAMILY_OPTIONS) <= set(option_names(cls))


def test_every_declared_option_is_read_by_its_family() -> None:
    for base in FamilyOptions.__bases__:
        readers = [e for e in EVALUATIONS.values()
                   if set(option_names(base)) & {*e.options, *(e.text_probes.options if e.text_probes else ())}]
        assert len(readers) == 1, f"{base.__name__}: read by {len(readers)} families' evaluations"
        (evaluation,) = readers
        read = {*evaluation.options, *(evaluation.text_probes.options if evaluation.text_probes else ())}
        assert set(option_names(base)) <= read, base.__name__


def test_the_families_checks_run_in_each_command() -> None:
    from gradscope.errors import GradscopeError
    for cls in (StabilityOptions, DynamicsOptions, AccuracyOptions):
        with pytest.raises(GradscopeError, match="corpus: got float"):
            cls(corpus=1.5)
