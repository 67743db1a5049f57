"""gradscope.workflows.study.registry: one plan per study that `reproduce --study` accepts, and each plans the
runs its options ask for (the synthetic study's defaults here; the lm study's plan on a corpus is
tests/workflows/study/test_lm.py's)."""

from __future__ import annotations

from pathlib import Path

from gradscope.workflows.study.options import STUDIES, SYNTHETIC, StudyOptions
from gradscope.workflows.study.registry import STUDY_PLANS


def test_every_study_has_one_plan() -> None:
    assert tuple(STUDY_PLANS) == STUDIES and STUDIES[0] == SYNTHETIC


def test_the_synthetic_plan_takes_the_study_defaults(tmp_path: Path) -> None:
    runs, stability = STUDY_PLANS[SYNTHETIC](StudyOptions(triplets=5, iterations=8), tmp_path)
    assert sorted({r.name.split("-")[0] for r in runs}) == ["gru", "lstm", "s4d"]
    assert sorted({r.config.train.seed for r in runs}) == [1, 2, 3] and len(runs) == 3 * 2 * 3
    assert all(r.config.train.iterations == 8 for r in runs) and stability.triplets == 5
    assert not any(tmp_path.iterdir())  # it prepares nothing
    runs, _ = STUDY_PLANS[SYNTHETIC](StudyOptions(models="gru", seeds="4"), tmp_path)
    assert [r.name for r in runs] == ["gru-none-s4", "gru-sinusoidal-s4"]
