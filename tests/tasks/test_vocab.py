"""The token distributions (SPEC §3): dual-frequency rarity with uniform draws within each group, and the
uniform vocabulary covering every token evenly."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from gradscope.tasks import sample_tokens

from tests.tasks.test_base import gen


@pytest.mark.parametrize("rarity", [0.125, 0.25, 0.5])
def test_dual_frequency_rarity_and_within_group_uniformity(rarity: float) -> None:
    tokens = sample_tokens((400_000,), 16, "dual", rarity, gen(1))
    rare = tokens >= 8
    # binomial sd is < 0.0008 here; 0.004 is > 5 sd
    assert abs(rare.float().mean().item() - rarity) < 0.004
    for group in (tokens[~rare], tokens[rare]):
        counts = torch.bincount(group - group.min(), minlength=8).numpy()
        assert stats.chisquare(counts).pvalue > 1e-4


def test_uniform_vocabulary_covers_all_tokens_evenly() -> None:
    counts = torch.bincount(sample_tokens((200_000,), 10, "uniform", 0.1, gen(2)), minlength=10).numpy()
    assert stats.chisquare(counts).pvalue > 1e-4
