"""The vocabulary-extension study (paper §4.2): it trains the parents, the extensions and the runs from
scratch once (resumable: finished runs are skipped) and tabulates them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.helpers.runs import small_run
from gradscope.files.checkpoint import load
from tests.train.test_extend import K, K2


def test_extension_study_reuses_parents_and_tabulates(tmp_path: Path) -> None:
    from gradscope.workflows.study.extension import ExtensionPlan, extension_table, run_extension, table_markdown

    base = small_run(iterations=6, distribution="dual")
    plan = ExtensionPlan(base, K2, seeds=(7,), pes=("none",), extend_iterations=4, distribution="uniform")
    events: list[str] = []
    runs = run_extension(plan, tmp_path, on_event=lambda step, msg: events.append(step))
    assert events == ["pretrain", "extension", "scratch"]
    ext = load(runs / plan.name("extension", "none", 7))
    assert ext.config.task.distribution == "uniform" and ext.config.train.iterations == 4
    assert load(runs / plan.name("scratch", "none", 7)).config.task == dataclasses.replace(
        ext.config.task, old_items=0)
    again: list[str] = []
    run_extension(plan, tmp_path, on_event=lambda step, msg: again.append(msg))
    assert all(m.endswith("done earlier") for m in again)  # resumable: finished runs are skipped
    rows = extension_table(plan, tmp_path)
    assert [(r.kind, r.pe) for r in rows] == [("extension", "none"), ("scratch", "none"), ("pretrain", "none")]
    assert rows[0].overall[0] == pytest.approx(json.loads((runs / plan.name("extension", "none", 7) / "eval.json")
                                                          .read_text())["uniform"]["token_accuracy"])
    text = table_markdown(rows, plan)
    assert f"extended {K}→{K2}" in text and f"scratch at {K2}" in text
