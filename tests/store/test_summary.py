"""A store's trials as summarize reads them (``store.summary.trial_records``): a store whose checkpoints come
from different configurations (a vanilla and a PE checkpoint in one `gradscope accuracy` call; two seeds in
one `stability` call) is one trial per configuration, each equal to that checkpoint's store alone; a trial
record of the whole refuses it. The stores come from tests/store/test_parts.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradscope.errors import GradscopeError
from gradscope.store.summary import trial_record, trial_records
from tests.store.test_parts import stores  # noqa: F401 - the fixture


def _same(a, b) -> None:
    assert a.fields == b.fields and a.seed == b.seed
    assert a.metrics.keys() == b.metrics.keys() and a.units.keys() == b.units.keys()
    for key in a.metrics:
        # bit for bit: the same checkpoints scored in this process on the same code path
        np.testing.assert_array_equal(a.metrics[key], b.metrics[key], err_msg=key)
    for key in a.units:
        np.testing.assert_array_equal(a.units[key], b.units[key], err_msg=key)
    assert a.nan_units == b.nan_units


def test_mixed_models_summarise_per_model(stores: dict[str, Path]) -> None:
    records = trial_records(stores["acc-mixed"])
    assert [r.fields["pe"] for r in records] == ["none", "sinusoidal"]
    _same(records[0], trial_record(stores["acc-vanilla"]))
    _same(records[1], trial_record(stores["acc-pe"]))
    assert records[0].metrics["token_accuracy"] != records[1].metrics["token_accuracy"]  # the two models differ


def test_mixed_seeds_are_two_trials(stores: dict[str, Path]) -> None:
    records = trial_records(stores["stab-seeds"])
    assert [r.seed for r in records] == [2, 5]
    # the same probes (same seed, same task) scored per checkpoint: equal to each checkpoint alone
    _same(records[0], trial_record(stores["stab-s1"]))
    _same(records[1], trial_record(stores["stab-s2"]))


def test_trial_record_refuses_a_mixed_store(stores: dict[str, Path]) -> None:
    with pytest.raises(GradscopeError, match="2 configurations"):
        trial_record(stores["acc-mixed"])
