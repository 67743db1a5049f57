"""The accuracy store's dataset (``gradscope.store.accuracy``), from hand-made counts of two checkpoints: the
ratios, coordinates and provenance it holds, checked as numbers written out here (NaN where nothing was
scored, never 0); the grid, a feedback model's decodings, an extended vocabulary's items and a family's own
part each present only when the counts hold them; a store of a family's part alone; and the family a store
is read as, with the values its family declares."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import xarray as xr

from gradscope.store.accuracy import (ITEM_NAMES, accuracy_dataset, family_dataset, family_sections, family_values,
                                      store_family)
from gradscope.store.records import AccuracyResult, FamilyResult
from gradscope.tasks import TASKS
from gradscope.tasks.family import Panel, ReportSection

from tests.helpers.runs import small_run
from tests.workflows.families.test_reverse_continuous import _continuous

NAN = np.nan
T = 8  # time steps of a reverse row of length 4: 4 inputs, then 4 outputs
# per time step, scored positions and those right at checkpoints 0 and 1: times 5, 6, 7 (1-based) are scored
TIME_SCORED = np.array([0, 0, 0, 0, 2, 2, 2, 0])
TIME_CORRECT = (np.array([0, 0, 0, 0, 2, 1, 0, 0]), np.array([0, 0, 0, 0, 2, 2, 2, 0]))


def _result(i: int, path: Path, **extra: object) -> AccuracyResult:
    """Checkpoint ``i`` (iteration 10·(i+1)) of three held-out sequences, the last of which has nothing scored:
    checkpoint 0 gets 3 of 6 tokens right (no sequence whole), checkpoint 1 all of them."""
    correct = [np.array([2, 1, 0]), np.array([3, 3, 0])][i]
    dl = [np.array([1, 2, 0]), np.array([0, 0, 0])][i]
    return AccuracyResult(path, 10 * (i + 1), f"run{i}", correct, np.array([3, 3, 0]), dl, TIME_CORRECT[i],
                          TIME_SCORED, **extra)  # type: ignore[arg-type]


def _results(tmp_path: Path, **per_checkpoint: tuple) -> list[AccuracyResult]:
    """Two checkpoints: the first a file that exists (its sha256 is recorded), the second none (recorded as '')."""
    (tmp_path / "a.pt").write_bytes(b"abc")
    return [_result(i, tmp_path / p, **{k: v[i] for k, v in per_checkpoint.items()})
            for i, p in enumerate(("a.pt", "missing.pt"))]


def test_the_token_part_holds_the_ratios_of_the_counts(tmp_path: Path) -> None:
    cfg = small_run()
    ds = accuracy_dataset(_results(tmp_path), cfg, {"bins": None, "grid": None}, "gradscope accuracy x", "cpu")
    np.testing.assert_array_equal(ds["token_accuracy"].values, [0.5, 1.0])
    np.testing.assert_array_equal(ds["sequence_accuracy"].values, [0.0, 1.0])  # the unscored sequence is left out
    np.testing.assert_array_equal(ds["dl_distance"].values, [1.0, 0.0])  # (1 + 2 + 0) / 3: every sequence counts
    assert ds["position_accuracy"].dims == ("checkpoint", "time")
    assert ds["time"].values.tolist() == [5, 6, 7]  # only the scored times, 1-based
    np.testing.assert_array_equal(ds["position_accuracy"].values, [[1.0, 0.5, 0.0], [1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(ds["sequence_correct"].values, [[2, 1, 0], [3, 3, 0]])
    np.testing.assert_array_equal(ds["sequence_scored"].values, [3, 3, 0])
    np.testing.assert_array_equal(ds["sequence_dl"].values, [[1, 2, 0], [0, 0, 0]])
    assert ds["checkpoint"].values.tolist() == [0, 1] and ds["iteration"].values.tolist() == [10, 20]
    assert ds["run"].values.tolist() == ["run0", "run1"] and ds["sequence"].values.tolist() == [0, 1, 2]
    assert ds["checkpoint_path"].values.tolist() == [str(tmp_path / "a.pt"), str(tmp_path / "missing.pt")]
    assert ds["sha256"].values.tolist() == [hashlib.sha256(b"abc").hexdigest(), ""]
    for absent in ("grid_accuracy", "target_group", "decoded_token_accuracy", "item_accuracy", "length_accuracy"):
        assert absent not in ds.variables, absent


def test_the_store_records_its_provenance_as_json(tmp_path: Path) -> None:
    cfg = small_run()
    ds = accuracy_dataset(_results(tmp_path), cfg, {"bins": 2, "grid": True}, "gradscope accuracy run", "cuda:1")
    assert ds.attrs["kind"] == "accuracy" and ds.attrs["command"] == "gradscope accuracy run"
    assert ds.attrs["device"] == "cuda:1"
    assert json.loads(ds.attrs["options"]) == {"bins": 2, "grid": True}  # as given
    for name, part in (("model_config", cfg.model), ("task_config", cfg.task), ("train_config", cfg.train)):
        assert ds.attrs[name] == json.dumps(dataclasses.asdict(part)), name
    assert json.loads(ds.attrs["checkpoints"]) == [
        {"path": str(tmp_path / "a.pt"), "iteration": 10, "run": "run0", "sha256": hashlib.sha256(b"abc").hexdigest()},
        {"path": str(tmp_path / "missing.pt"), "iteration": 20, "run": "run1", "sha256": ""}]


def test_a_model_gradscope_did_not_train_gives_its_three_config_dicts(tmp_path: Path) -> None:
    configs = {"model_config": {"name": "mine"}, "task_config": {"name": "not-a-family"}, "train_config": {}}
    ds = accuracy_dataset(_results(tmp_path), configs, {}, "cmd", "cpu")
    assert {k: json.loads(ds.attrs[k]) for k in configs} == configs
    np.testing.assert_array_equal(ds["token_accuracy"].values, [0.5, 1.0])


def test_the_grid_is_binned_and_nan_where_a_cell_scored_nothing(tmp_path: Path) -> None:
    """A grid of 2 × 2 cells × 4 target positions; the (rare, rare) cell scored nothing."""
    total = np.full((2, 2, 4), 2)
    total[1, 1] = 0
    correct = [np.where(total > 0, 1, 0), total.copy()]  # half right, then all right
    binned = lambda x: np.stack([x[..., 0:2].sum(-1), x[..., 2:4].sum(-1)], axis=-1)  # noqa: E731 (bins 2: 1–2, 3–4)
    results = _results(tmp_path, grid_correct=correct, grid_total=(total, total),
                       grid_bin_correct=[binned(c) for c in correct], grid_bin_total=(binned(total), binned(total)))
    ds = accuracy_dataset(results, small_run(), {"bins": 2}, "cmd", "cpu")
    assert ds["grid_accuracy"].dims == ("checkpoint", "target_group", "disturbant_group", "target_position")
    expected = np.full((2, 2, 2, 4), 0.5)
    expected[1] = 1.0
    expected[:, 1, 1] = NAN
    np.testing.assert_array_equal(ds["grid_accuracy"].values, expected)
    np.testing.assert_array_equal(ds["grid_bin_accuracy"].values, expected[..., :2])  # the same in each bin
    np.testing.assert_array_equal(ds["grid_n"].values, binned(total))
    np.testing.assert_array_equal(ds["grid_total"].values, total)
    assert ds["target_group"].values.tolist() == ["frequent", "rare"] == ds["disturbant_group"].values.tolist()
    assert ds["target_position"].values.tolist() == [1, 2, 3, 4] and ds["bin"].values.tolist() == [0, 1]
    assert ds["bin_start"].values.tolist() == [1, 3] and ds["bin_end"].values.tolist() == [2, 4]
    edges = accuracy_dataset(results, small_run(), {"bins": (0, 1, 4)}, "cmd", "cpu")  # explicit edges
    assert edges["bin_start"].values.tolist() == [1, 2] and edges["bin_end"].values.tolist() == [1, 4]


def test_a_feedback_models_decodings_stand_side_by_side(tmp_path: Path) -> None:
    scored = np.stack([TIME_SCORED, TIME_SCORED])  # (decodings, T)
    correct = [np.stack([TIME_CORRECT[0], TIME_SCORED]), np.stack([TIME_CORRECT[1], np.zeros(T, int)])]
    results = _results(tmp_path, decodings=(("autoregressive", "teacher"),) * 2, decoded_time_correct=correct,
                       decoded_time_scored=(scored, scored))
    ds = accuracy_dataset(results, small_run(), {}, "cmd", "cpu")
    assert ds["decoding"].values.tolist() == ["autoregressive", "teacher"]
    np.testing.assert_array_equal(ds["decoded_token_accuracy"].values, [[0.5, 1.0], [1.0, 0.0]])
    assert ds["decoded_position_accuracy"].dims == ("checkpoint", "decoding", "time")
    np.testing.assert_array_equal(ds["decoded_position_accuracy"].values,
                                  [[[1.0, 0.5, 0.0], [1.0, 1.0, 1.0]], [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]])


def test_an_extended_vocabulary_counts_old_and_new_items(tmp_path: Path) -> None:
    """Old items: 4 scored at times 5–6, new items: 2 at time 7; checkpoint 0 gets the old ones right."""
    scored = np.array([[0, 0, 0, 0, 2, 2, 0, 0], [0, 0, 0, 0, 0, 0, 2, 0]])
    correct = [np.array([[0, 0, 0, 0, 2, 2, 0, 0], [0] * T]), np.array([[0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 2, 0]])]
    grid_total = np.zeros((2, 2, 2, 4), int)
    grid_total[..., 0, :] = 2  # old items at every target position, new ones only at positions 3–4
    grid_total[..., 1, 2:] = 1
    old_only = grid_total.copy()
    old_only[..., 1, :] = 0
    grid_correct = [old_only, grid_total]  # checkpoint 0 gets the old items right, checkpoint 1 every item
    results = _results(tmp_path, item_time_correct=correct, item_time_scored=(scored, scored),
                       grid_item_correct=grid_correct, grid_item_total=(grid_total, grid_total))
    ds = accuracy_dataset(results, small_run(), {"bins": 2}, "cmd", "cpu")
    assert ds["item"].values.tolist() == list(ITEM_NAMES) == ["old", "new"]
    np.testing.assert_array_equal(ds["item_accuracy"].values, [[1.0, 0.0], [0.5, 1.0]])
    np.testing.assert_array_equal(ds["item_n"].values, [4, 2])
    np.testing.assert_array_equal(ds["item_position_accuracy"].values,
                                  [[[1.0, 1.0, NAN], [NAN, NAN, 0.0]], [[0.5, 0.5, NAN], [NAN, NAN, 1.0]]])
    binned = ds["grid_item_bin_accuracy"]
    assert binned.dims == ("checkpoint", "target_group", "disturbant_group", "item", "bin")
    np.testing.assert_array_equal(binned.values[0, 0, 0], [[1.0, 1.0], [NAN, 0.0]])  # no new item in bin 1–2
    np.testing.assert_array_equal(binned.values[1, 1, 1], [[1.0, 1.0], [NAN, 1.0]])


def _variable_counts() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """reverse-variable's own counts per sequence length (index L): lengths 2 and 4 occur."""
    total = np.array([0, 0, 4, 0, 8])
    return ({"length_correct": np.array([0, 0, 1, 0, 2]), "length_total": total},
            {"length_correct": np.array([0, 0, 4, 0, 6]), "length_total": total})


def test_a_family_adds_its_own_part_as_it_declares(tmp_path: Path) -> None:
    cfg = small_run(name="reverse-variable", min_length=2)
    ds = accuracy_dataset(_results(tmp_path, family=_variable_counts()), cfg, {}, "cmd", "cpu")
    assert ds["length"].values.tolist() == [2, 4]
    np.testing.assert_array_equal(ds["length_accuracy"].values, [[0.25, 0.25], [1.0, 0.75]])
    np.testing.assert_array_equal(ds["token_accuracy"].values, [0.5, 1.0])  # beside the token part
    configs = {"model_config": {}, "task_config": {"name": "reverse-variable"}, "train_config": {}}
    assert "length_accuracy" in accuracy_dataset(_results(tmp_path, family=_variable_counts()), configs, {}, "c", "cpu")
    for config in (small_run(), {**configs, "task_config": {"name": "not-a-family"}}):  # no family reads the counts
        assert "length_accuracy" not in accuracy_dataset(_results(tmp_path, family=_variable_counts()), config, {},
                                                         "c", "cpu")
    assert "length_accuracy" not in accuracy_dataset(_results(tmp_path), cfg, {}, "c", "cpu")  # no counts: no part


def test_a_family_store_is_its_own_part_alone(tmp_path: Path) -> None:
    """reverse-continuous: cosines of 2 sequences × 3 output times per checkpoint, NaN where unscored."""
    cfg = _continuous(dim=3)
    cosine = np.array([[NAN, 1.0, 0.5, 0.0], [NAN, 0.5, 0.5, 0.5]])
    counts = [{"cosine": cosine * s, "times": np.array([1, 2, 3]), "mean": np.array([0.75, 0.5, 0.25]) * s,
               "low": np.zeros(3), "high": np.ones(3)} for s in (1.0, 2.0)]
    paths = [tmp_path / "a.pt", tmp_path / "b.pt"]
    for p, text in zip(paths, (b"a", b"b")):
        p.write_bytes(text)
    results = [FamilyResult(p, it, "r", c) for p, it, c in zip(paths, (5, 9), counts)]
    ds = family_dataset(results, cfg, {"seed": 4}, "gradscope accuracy r", "cpu")
    assert "token_accuracy" not in ds and "sequence_correct" not in ds
    np.testing.assert_allclose(ds["cosine_similarity"].values, [0.5, 1.0])  # the mean of the 6 scored positions
    np.testing.assert_allclose(ds["sequence_cosine"].values, [[0.5, 0.5], [1.0, 1.0]])
    np.testing.assert_allclose(ds["position_cosine"].values, [[0.75, 0.5, 0.25], [1.5, 1.0, 0.5]])
    assert ds["time"].values.tolist() == [2, 3, 4] and ds["sequence"].values.tolist() == [0, 1]
    assert ds["iteration"].values.tolist() == [5, 9] and ds["run"].values.tolist() == ["r", "r"]
    assert ds["checkpoint_path"].values.tolist() == [str(p) for p in paths]
    assert ds["sha256"].values.tolist() == [hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()]
    assert ds.attrs["kind"] == "accuracy" and json.loads(ds.attrs["options"]) == {"seed": 4}
    assert json.loads(ds.attrs["task_config"])["name"] == "reverse-continuous"
    assert [c["iteration"] for c in json.loads(ds.attrs["checkpoints"])] == [5, 9]


def _with_task(task: object) -> xr.Dataset:
    return xr.Dataset(attrs={"task_config": json.dumps(task)})


def test_a_store_is_read_as_its_tasks_family() -> None:
    assert store_family(_with_task({"name": "reverse-variable"})) is TASKS["reverse-variable"]
    assert store_family(_with_task({"name": "text"})) is TASKS["lm"]  # a raw text's store is read as lm's
    for task in ({"name": "not-a-family"}, {"name": 3}, {}, ["reverse"], "reverse"):
        assert store_family(_with_task(task)) is None, task
    assert store_family(xr.Dataset()) is None  # no task recorded


def test_family_values_are_its_declared_variables_at_one_checkpoint(tmp_path: Path) -> None:
    cfg = small_run(name="reverse-variable", min_length=2)
    ds = accuracy_dataset(_results(tmp_path, family=_variable_counts()), cfg, {}, "cmd", "cpu")
    family, last = family_values(ds)
    assert family is TASKS["reverse-variable"] and set(last) == {"length_accuracy", "length"}
    np.testing.assert_array_equal(last["length_accuracy"], [1.0, 0.75])
    np.testing.assert_array_equal(last["length"], [2, 4])  # no checkpoint dim: as it is
    np.testing.assert_array_equal(family_values(ds, at=0)[1]["length_accuracy"], [0.25, 0.25])
    partial = family_values(ds.drop_vars("length_accuracy"))[1]  # a variable the store lacks is left out
    assert set(partial) == {"length"}
    assert family_values(accuracy_dataset(_results(tmp_path), small_run(), {}, "c", "cpu")) == (TASKS["reverse"], {})
    assert family_values(xr.Dataset()) == (None, {})


def test_family_sections_are_the_registered_families_with_a_report(monkeypatch: pytest.MonkeyPatch) -> None:
    section = ReportSection(heading="Echo", text="t", panels=(Panel(variable="v", x="x"),))

    class Echo(TASKS["reverse"]):  # type: ignore[misc, valid-type]
        report: ClassVar[ReportSection | None] = section

    class Silent(TASKS["reverse"]):  # type: ignore[misc, valid-type]
        report: ClassVar[ReportSection | None] = None

    before = family_sections()
    assert [name for name, _, _ in before] == [n for n, c in TASKS.items() if c.report is not None]
    assert all(cls is TASKS[name] and report is cls.report for name, cls, report in before)
    monkeypatch.setitem(TASKS, "echo", Echo)
    monkeypatch.setitem(TASKS, "silent", Silent)
    assert family_sections() == [*before, ("echo", Echo, section)]
