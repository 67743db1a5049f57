"""The lm task: each row is one paragraph of the corpus from its start, so positional encodings restart
on every paragraph and nothing leaks between rows. The tiny corpus comes from tests/corpus/test_lm.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gradscope.models import SeqModel
from gradscope.models.pe import SinusoidalPE
from gradscope.tasks import IGNORE, make_task

from tests.corpus.test_lm import corpus_dir, lm_config  # noqa: F401 - the fixture


def test_paragraph_alignment_pe_restarts_on_the_models_inputs(corpus_dir: Path) -> None:
    cfg = lm_config(corpus_dir, pe="sinusoidal", length=24)
    task = make_task(cfg.task)
    train_split = task.corpus.splits["train"]
    index = np.array([0, 1, 2, 3, 4, 5])
    batch = task.rows("train", index)
    torch.manual_seed(0)
    model = SeqModel(cfg.model)
    x = model.core_inputs(batch.inputs)  # (n, T, 2E)
    pe = SinusoidalPE(cfg.model.embed_size)(batch.inputs.shape[1])  # (T, E)
    for row, i in enumerate(index):
        words = train_split.paragraph(int(i))[:24]
        m = words.size
        assert batch.inputs[row, 0] == task.query and torch.equal(batch.inputs[row, 1:m], torch.from_numpy(words[:-1]).long())
        assert torch.equal(batch.targets[row, :m], torch.from_numpy(words).long())
        assert bool((batch.targets[row, m:] == IGNORE).all())
        # the PE half of the core's input: position t of every paragraph reads PE(t), t = 0 at its start
        assert torch.allclose(x[row, :, 8:], pe, atol=1e-6)
        # the same paragraph alone gives the same inputs over its tokens: nothing leaks between rows
        alone = model.core_inputs(task.rows("train", np.array([i])).inputs)[0]
        assert torch.allclose(x[row, :m], alone[:m], atol=1e-6)
    assert max(train_split.lengths) > 24 and int((batch.targets != IGNORE).sum(1).max()) <= 24  # truncated at L
