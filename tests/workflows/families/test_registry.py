"""gradscope.workflows.families.registry: a family's evaluation is declared once, on its line of EVALUATIONS, and what the
rest of the library says about families is computed from those declarations, never a family's name typed in."""

from __future__ import annotations

import re
from pathlib import Path

from gradscope.tasks.registry import TASKS
from gradscope.workflows.families.registry import EVALUATIONS, evaluation_of, text_families

ROOT = Path(__file__).resolve().parents[3]


def test_probed_on_its_own_text_is_declared_once_on_the_evaluation() -> None:
    """Whether a family is probed on its own text is its evaluation's ``text_probes`` (the probe source itself):
    no task class says it again (training reads ``padded_rows``, a fact of its batches)."""
    again = [f"{n}.{a}" for n, cls in TASKS.items() for a in dir(cls) if a.endswith("_probes")]
    assert not again, f"a second declaration of the probe source, on the task class: {again}"
    assert text_families() == [n for n, cls in TASKS.items() if evaluation_of(cls).text_probes is not None]
    assert text_families() == ["lm"]  # the one family probed on its text (and the check sees it)


def test_the_analysis_workflows_name_no_family() -> None:
    """stability, dynamics, accuracy, the API level, the sources and the options name no registered family with
    an evaluation of its own: their messages and help compute the names from the registry (text_families)."""
    own = {name for name, cls in TASKS.items() if cls in EVALUATIONS}
    assert own  # the check sees the families it is about
    words = re.compile("|".join(rf"\b{re.escape(n)}\b" for n in own) + r"|LanguageModel|ReverseContinuous")
    for rel in ("workflows/stability.py", "workflows/dynamics.py", "workflows/accuracy.py", "workflows/api.py",
                "workflows/sources.py", "workflows/options.py", "workflows/common.py"):
        text = (ROOT / "gradscope" / rel).read_text()
        found = sorted(set(words.findall(text)))
        assert not found, f"gradscope/{rel} names {found}"


def test_another_familys_probe_option_is_refused_naming_the_families_that_read_it(tmp_path: Path) -> None:
    """corpus (and stability's length) are read only by a family probed on its corpus; given for a checkpoint of
    another family, stability and dynamics refuse it in one line naming those families, computed from the
    declarations (it was ignored by dynamics)."""
    import pytest

    import gradscope

    run = ROOT / "sample_checkpoints" / "gru-none-s1"
    readers = ", ".join(text_families())
    for call, option in ((lambda: gradscope.dynamics(run, corpus=tmp_path, parts="flow"), "corpus"),
                         (lambda: gradscope.stability(run, corpus=tmp_path), "corpus"),
                         (lambda: gradscope.stability(run, length=8), "length")):
        with pytest.raises(gradscope.GradscopeError, match=rf"^{option}: got .* it applies to {readers} runs only"):
            call()


def test_a_refused_path_option_is_shown_as_given(tmp_path: Path) -> None:
    """A family's path option (a Path in every command's options) reads in the refusal as the text it was given as,
    not as a PosixPath(...) repr."""
    import pytest

    import gradscope

    run = ROOT / "sample_checkpoints" / "gru-none-s1"
    for call in (lambda: gradscope.accuracy(run, corpus=tmp_path), lambda: gradscope.stability(run, corpus=str(tmp_path))):
        with pytest.raises(gradscope.GradscopeError, match=rf"^corpus: got '{re.escape(str(tmp_path))}', but "):
            call()
