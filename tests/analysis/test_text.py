"""Raw text scored by a pretrained LM: long paragraphs are scored once, in overlapping windows that give
each target enough context (``analysis.text.windows``), and a short window changes the numbers only
through that context. The tiny model and text come from tests/workflows/text/test_accuracy.py."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from gradscope.analysis.text import windows  # noqa: E402
from tests.workflows.text.test_accuracy import saved  # noqa: E402,F401 - the fixture


def test_long_paragraphs_are_scored_once_in_overlapping_windows(saved) -> None:  # noqa: ANN001
    """Windows score every target once, each with at least max_length − max_length // 2 tokens of
    context; a short max_length changes the numbers only through that context."""
    import gradscope

    for n in (1, 2, 5, 17, 64, 65, 200):
        for length in (2, 3, 8, 64):
            rows = windows(n, length)
            scored = [j for a, b, first in rows for j in range(first, b)]
            assert scored == list(range(1, n)), (n, length)
            assert all(b - a <= length and first - a >= min(first, length - length // 2) for a, b, first in rows)
    model_dir, text = saved
    full = gradscope.accuracy(model_dir, model_factory="hf", text=text, max_length=64, resamples=20)
    short = gradscope.accuracy(model_dir, model_factory="hf", text=text, max_length=8, resamples=20)
    assert int(full["pos_n"].sum()) == int(short["pos_n"].sum())
    first = full["pos_perplexity"].isel(checkpoint=0, pos_bin=[0, 1, 2]).values  # positions 1–7: one window either way
    assert np.allclose(first, short["pos_perplexity"].isel(checkpoint=0, pos_bin=[0, 1, 2]).values, rtol=1e-5)
