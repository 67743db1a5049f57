"""gradscope.workflows.study.lm_options: the lm study's own options (its corpus's raw files, its probes), its
notes in the shared options' help and its rules are declared once, with the study; StudyOptions takes them as
a base and checks its rules, and another study refuses them."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from gradscope.errors import GradscopeError
from gradscope.workflows.study.lm_options import LM_STUDY, LMStudyOptions
from gradscope.workflows.study.options import STUDIES, STUDY_BASES, StudyOptions

OWN = ("corpus_text", "valid_file", "test_file", "target_pos", "probe_length")


def refused(message: str) -> pytest.RaisesContext:
    return pytest.raises(GradscopeError, match=f"^{re.escape(message)}")


def test_the_study_declares_its_options_and_study_options_takes_them_unchanged() -> None:
    assert tuple(f.name for f in dataclasses.fields(LMStudyOptions)) == OWN
    assert LMStudyOptions in STUDY_BASES and LM_STUDY in STUDIES
    mine = {f.name: f for f in dataclasses.fields(LMStudyOptions)}
    theirs = {f.name: f for f in dataclasses.fields(StudyOptions)}
    for name in OWN:
        assert theirs[name].metadata["help"] == mine[name].metadata["help"] and theirs[name].default is None
    own = inspect.get_annotations(StudyOptions)
    assert own and not set(own) & set(OWN)  # none declared again


def test_its_notes_reach_the_shared_options_help() -> None:
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(StudyOptions)}
    assert f"{LM_STUDY}: {LMStudyOptions.ABOUT}" in helps["study"]
    for key, note in LMStudyOptions.NOTES.items():
        assert f"({LM_STUDY}: {note})" in helps[key], key


def test_its_rules_hold_in_study_options() -> None:
    opts = StudyOptions(study=LM_STUDY, corpus_text="w.raw", target_pos=3, probe_length=8)
    assert (opts.corpus_text, opts.target_pos, opts.probe_length) == ("w.raw", 3, 8)
    assert StudyOptions(study=LM_STUDY, models="lstm").models == ("lstm",)
    with refused("models: got 'gru'; the lm study trains the paper's LSTM only"):
        StudyOptions(study=LM_STUDY, models="gru")
    with refused("target_pos/probe_length: they set the lm study's probes (study lm)"):
        StudyOptions(probe_length=8)
    for name in ("corpus_text", "valid_file", "test_file"):
        with refused("corpus_text/valid_file/test_file: they belong to the lm study (study lm)"):
            StudyOptions(**{name: Path("x.raw")})
