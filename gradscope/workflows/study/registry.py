"""The studies `gradscope reproduce --study NAME` runs, one line each: NAME → its plan, (options, out) → the
study's runs and the stability options they share. A study's own options, notes and rules are declared with it
(:data:`gradscope.workflows.study.options.STUDY_BASES`); the synthetic study is the default."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from gradscope.workflows.options import StabilityOptions
from gradscope.workflows.study.lm import plan_lm_study
from gradscope.workflows.study.lm_options import LM_STUDY
from gradscope.workflows.study.options import SYNTHETIC, StudyOptions
from gradscope.workflows.study.runs import PlannedRun, plan_synthetic_study

STUDY_PLANS: dict[str, Callable[[StudyOptions, Path], tuple[list[PlannedRun], StabilityOptions]]] = {
    SYNTHETIC: plan_synthetic_study,
    LM_STUDY: plan_lm_study,
}
