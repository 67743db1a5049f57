"""Every list of choices in `--help` and in the docs comes from its registry (issue #47 part 4): the tasks,
cores, PE kinds, scores, parts, estimators, engines, groups and intervals. A list in the docs sits between
``<!-- registry: NAME -->`` and ``<!-- /registry -->``, or is a flag's ``--flag a|b|c``; either must name
exactly what is registered."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gradscope import fields
from gradscope.analysis.scores import SCORES
from gradscope.models.pe import PE_TYPES
from gradscope.models.registry import CORES
from gradscope.tasks.registry import TASKS
from gradscope.workflows import dynamics, options

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
REGISTRIES = {"cores": lambda: list(CORES), "tasks": lambda: list(TASKS), "pes": lambda: list(PE_TYPES),
              "scores": lambda: list(SCORES), "parts": lambda: list(fields.PARTS)}
# a flag's choices as the docs write them (`--flag a|b|c`), and what each must be
FLAG_CHOICES = {"score": lambda: set(SCORES), "estimator": lambda: set(fields.ESTIMATORS),
                "method": lambda: {"auto", *fields.ENGINES}, "interval": lambda: set(fields.INTERVALS),
                "core": lambda: set(CORES), "pe": lambda: set(PE_TYPES), "task": lambda: set(TASKS)}


def test_the_torch_free_names_are_the_registries() -> None:
    assert tuple(SCORES) == fields.SCORE_KINDS
    assert options.PARTS is fields.PARTS and set(dynamics.OWNERS) == set(fields.PARTS)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_docs_lists_name_what_is_registered(page: Path) -> None:
    text = page.read_text()
    for name, body in re.findall(r"<!-- registry: (\w+) -->(.*?)<!-- /registry -->", text, flags=re.S):
        assert name in REGISTRIES, f"{page.name}: unknown registry {name!r}"
        assert re.findall(r"`([^`]+)`", body) == REGISTRIES[name](), f"{page.name}: the {name} list is not the registry's"
    for flag, choices in re.findall(r"`--([a-z-]+) ((?:[a-z0-9][a-z0-9-]*\|)+[a-z0-9][a-z0-9-]*)`", text):
        if flag in FLAG_CHOICES:
            assert set(choices.split("|")) == FLAG_CHOICES[flag](), f"{page.name}: --{flag} {choices}"


def test_the_docs_list_the_registries_somewhere() -> None:
    text = "".join(page.read_text() for page in PAGES)
    found = set(re.findall(r"<!-- registry: (\w+) -->", text))
    assert found == set(REGISTRIES) - {"scores"}  # the scores are listed as --score's choices
    flags = set(re.findall(r"`--([a-z-]+) (?:[a-z0-9][a-z0-9-]*\|)+[a-z0-9][a-z0-9-]*`", text))
    assert {"score", "estimator", "method", "interval"} <= flags


def test_a_registered_name_reaches_help_and_a_drifted_doc_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from gradscope.presets import with_choices
    monkeypatch.setitem(TASKS, "added", TASKS["copy"])
    monkeypatch.setattr(fields, "PARTS", (*fields.PARTS, "extra"))
    assert "mqar or added" in with_choices("{tasks}")
    assert fields.with_names("{parts}").endswith("lyapunov and extra")
    body = "<!-- registry: tasks -->`reverse`<!-- /registry -->"
    assert re.findall(r"`([^`]+)`", body) != REGISTRIES["tasks"]()


def test_help_texts_carry_no_hand_written_lists() -> None:
    """Each option's help names its choices by placeholder; as shown, the placeholder is the registry's list."""
    import dataclasses
    lists = {"frequent, rare", "default, frobenius", "flow, grid, spectra", "analytic, vjp", "percentile, bca"}
    from gradscope.workflows.study import options as study_options
    classes = [options.StabilityOptions, options.DynamicsOptions, options.AccuracyOptions, options.SummarizeOptions,
               *(getattr(study_options, n) for n in ("ReportOptions", "StudyOptions", "TextStudyOptions"))]
    for cls in classes:
        for f in dataclasses.fields(cls):
            text = f.metadata.get("help", "")
            assert not any(x in text for x in lists), f"{cls.__name__}.{f.name}: {text}"
    shown = fields.with_names(dataclasses.fields(options.DynamicsOptions)[0].metadata.get("help", "") + " {scores}")
    assert "default, frobenius or l1" in shown
