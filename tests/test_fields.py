"""The field checks every frozen config and options class shares (``gradscope.fields``), on values made
here: integers from outside, a dataclass checked against the ranges and choices its fields declare, a
dict turned into a config, and choices listed for a help text."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from gradscope.errors import GradscopeError
from gradscope.fields import as_count, as_int, as_seed, check_fields, from_dict, listed, option, with_overrides
from gradscope.workflows.options import (AccuracyOptions, DynamicsOptions, StabilityOptions, SummarizeOptions,
                                         TrainOptions)


def test_an_integer_from_outside_is_an_int_within_its_bounds() -> None:
    assert as_int(3.0, "n") == 3 and type(as_int(3.0, "n")) is int
    assert as_int(torch.tensor(4), "n") == 4 and as_count(np.int64(5), "n") == 5
    for bad in (True, "3", 2.5, float("nan"), 1e30, None):
        with pytest.raises(GradscopeError, match="^n: got .*expected an integer"):
            as_int(bad, "n")
    with pytest.raises(GradscopeError, match="^n: got 0; it must be between 1 and 5$"):
        as_int(0, "n", 1, 5)
    with pytest.raises(GradscopeError, match="it must be at least 1$"):
        as_int(0, "n", low=1)
    with pytest.raises(GradscopeError, match="it must be at most 5$"):
        as_int(9, "n", high=5)
    assert as_seed(0) == 0 and as_seed(2**63 - 1) == 2**63 - 1
    for bad in (-1, 2**63):
        with pytest.raises(GradscopeError, match="^seed: got"):
            as_seed(bad)


@dataclass(frozen=True)
class Settings:
    share: float = option(0.5, "A share.", low=0.0, high=1.0, exclusive="low")
    count: int = option(2, "A count.", low=1)
    mode: str = option("a", "A mode.", choices=("a", "b"))
    limit: float | None = option(None, "A limit.", low=0.0)

    def __post_init__(self) -> None:
        check_fields(self)


def test_fields_are_checked_against_the_ranges_and_choices_they_declare() -> None:
    ok = Settings(share=1, count=2.0, limit=None)
    assert (ok.share, type(ok.share)) == (1.0, float) and (ok.count, type(ok.count)) == (2, int)
    for given, words in (({"share": 0.0}, r"^share: got 0.0; it must be a number in \(0, 1\]$"),
                         ({"share": float("nan")}, "^share: got nan"), ({"share": True}, "^share: got True"),
                         ({"count": 0}, "^count: got 0; it must be at least 1$"),
                         ({"mode": "c"}, "^mode: got 'c'; valid values are a, b$"),
                         ({"limit": -1.0}, r"^limit: got -1.0; it must be a finite number ≥ 0$")):
        with pytest.raises(GradscopeError, match=words):
            Settings(**given)


def test_a_dict_becomes_a_config_or_a_one_line_error() -> None:
    assert from_dict(Settings, {"share": 0.25, "mode": "b"}) == Settings(share=0.25, mode="b")
    with pytest.raises(GradscopeError, match=r"^Settings: unknown field\(s\) colour, size$"):
        from_dict(Settings, {"size": 1, "colour": 2})
    with pytest.raises(GradscopeError, match="^Settings: expected a mapping of fields; got list$"):
        from_dict(Settings, [1, 2])  # type: ignore[arg-type]


def test_choices_are_listed_for_a_help_text() -> None:
    assert listed(("a",)) == "a" and listed(["a", "b", "c"]) == "a, b or c" and listed(("x", "y"), "and") == "x and y"


# --- with_overrides: the options a public function runs with -------------------------------------------------

def test_overrides_replace_fields_of_the_options_given_or_of_the_defaults() -> None:
    base = DynamicsOptions(sv=4, seed=2)
    assert with_overrides(DynamicsOptions, base, {"seed": 5, "reorth": 3}, "dynamics") == \
        DynamicsOptions(sv=4, seed=5, reorth=3)
    assert with_overrides(AccuracyOptions, None, {"bins": "2"}, "accuracy") == AccuracyOptions(bins=2)
    assert with_overrides(TrainOptions, None, {}, "train") == TrainOptions()


def test_overrides_refuse_an_unknown_name_and_options_of_another_command() -> None:
    with pytest.raises(GradscopeError, match=r"^abc: not an option of summarize; its options are kind, by, unit, "):
        with_overrides(SummarizeOptions, None, {"zzz": 1, "abc": 2}, "summarize")  # the first, by name
    with pytest.raises(GradscopeError, match=r"^opts: got StabilityOptions; expected AccuracyOptions\(…\)$"):
        with_overrides(AccuracyOptions, StabilityOptions(), {}, "accuracy")
