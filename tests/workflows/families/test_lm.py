"""The lm family's probes, drawn from the corpus's test paragraphs: triplets share what they should and
each member's target token is of its class. The tiny corpus comes from tests/corpus/test_lm.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gradscope.corpus import frequency_bins
from gradscope.tasks import make_task
from gradscope.workflows.families.lm import lm_probes

from tests.corpus.test_lm import corpus_dir, lm_config  # noqa: F401 - the fixture


def test_probes_on_real_text_share_what_they_should(corpus_dir: Path) -> None:
    task = make_task(lm_config(corpus_dir, length=24).task)
    position, length = 3, 10
    probes = lm_probes(task, 5, position, length, ("frequent", "rare"), seed=0)
    t = probes.tokens  # (10, 3, 10)
    halves = frequency_bins(task.corpus.counts, 2)
    assert bool((t[:, :, 0] == task.query).all())
    assert torch.equal(t[:, 1, :position + 1], t[:, 0, :position + 1])  # same-target: prefix and target shared
    assert torch.equal(t[:, 2, position + 1:], t[:, 0, position + 1:])  # same-suffix: suffix shared
    for member in range(3):
        cls = halves[t[:, member, position].numpy()]
        assert list(cls) == [0] * 5 + [1] * 5  # every member's target token is of the triplet's class
    rows = {tuple(task.rows("test", np.array([i]), width=length).inputs[0].tolist())
            for i in range(len(task.corpus.splits["test"]))}
    assert all(tuple(r.tolist()) in rows for r in t[:, 0])  # base rows are real test paragraphs
    assert probes.conditions[0] == "frequent/text" and probes.conditions[-1] == "rare/text"
