"""What a family declares (gradscope/tasks/family.py) on its own: the count helpers (ratio, stack, units,
perplexity) on known inputs with exact outputs, and the declaration types (Variable, Panel, ReportSection). That
every registered family's declarations agree with the store and the report is tests/project/test_contracts.py's."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from gradscope.tasks.family import (COUNT, FLOAT, INT, STR, Panel, ReportSection, Variable, perplexity, ratio, stack,
                                    units)


def test_ratio_is_nan_where_nothing_was_scored() -> None:
    num, den = np.array([[3, 0, 2], [1, 4, 0]]), np.array([[4, 0, 8], [2, 4, 0]])
    out = ratio(num, den)
    assert out.dtype == np.float64 and out.shape == (2, 3)
    np.testing.assert_array_equal(out, [[0.75, np.nan, 0.25], [0.5, 1.0, np.nan]])


def test_ratio_warns_about_nothing_on_zero_counts() -> None:
    with np.errstate(all="raise"):  # a 0/0 would raise here, were it not guarded
        assert math.isnan(float(ratio(np.array(0), np.array(0))))


def test_stack_puts_checkpoints_first() -> None:
    counts = [{"correct": [1, 2], "total": np.array([3, 4])}, {"correct": np.array([5, 6]), "total": [7, 8]}]
    np.testing.assert_array_equal(stack(counts, "correct"), [[1, 2], [5, 6]])
    np.testing.assert_array_equal(stack(counts, "total"), [[3, 4], [7, 8]])
    assert stack(counts, "total").shape == (2, 2)
    with pytest.raises(KeyError):
        stack(counts, "missing")


def test_units_are_one_per_right_token_then_zero_per_wrong_one() -> None:
    np.testing.assert_array_equal(units(3, 5), [1.0, 1.0, 1.0, 0.0, 0.0])
    assert units(np.int64(2), np.int64(2)).tolist() == [1.0, 1.0]
    assert units(0, 0).shape == (0,)
    out = units(4, 10)
    assert out.dtype == np.float64 and out.mean() == 0.4  # the accuracy those units resample


def test_perplexity_is_exp_of_the_mean_nll() -> None:
    assert perplexity(0.0, 7) == 1.0
    assert perplexity(2 * math.log(3.0), 2) == pytest.approx(3.0, rel=1e-15)
    assert isinstance(perplexity(1.0, 1), float) and perplexity(1.0, 1) == math.e
    assert math.isnan(perplexity(1.0, 0))  # nothing scored


def test_perplexity_over_arrays_is_elementwise() -> None:
    nll, n = np.array([0.0, math.log(2.0) * 4, 5.0]), np.array([3, 4, 0])
    out = perplexity(nll, n)
    assert isinstance(out, np.ndarray) and out.shape == (3,)
    np.testing.assert_allclose(out[:2], [1.0, 2.0], rtol=1e-15, atol=0)
    assert math.isnan(out[2])
    np.testing.assert_allclose(perplexity(np.array([[2.0]]), np.array([[1]])), [[math.exp(2.0)]], rtol=1e-15)


def test_the_kinds_are_the_store_schemas_names() -> None:
    assert (FLOAT, INT, COUNT, STR) == ("float", "int", "count", "str")


def test_declarations_are_frozen_and_keyword_only() -> None:
    v = Variable(dims=("checkpoint", "end"), kind=FLOAT)
    assert v.help == ""
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.kind = INT  # type: ignore[misc]
    with pytest.raises(TypeError):
        Variable(("checkpoint",), FLOAT)  # type: ignore[misc]
    with pytest.raises(TypeError):
        Panel("end_accuracy", "end")  # type: ignore[misc]


def test_a_panels_defaults() -> None:
    p = Panel(variable="end_accuracy", x="end")
    assert (p.split, p.title, p.x_title, p.y_title) == (None, "", "", "accuracy")
    assert (p.log_y, p.x_only, p.x_ticks, p.bounds) == (False, None, None, None)


def test_a_report_section_lists_its_panels_variables_in_order() -> None:
    section = ReportSection(heading="h", text="t", panels=(Panel(variable="b", x="x"), Panel(variable="a", x="x"),
                                                           Panel(variable="b", x="y", split="s")))
    assert section.variables() == ("b", "a", "b")
    assert ReportSection(heading="h", text="t", panels=()).variables() == ()
