"""The language model's counts on a corpus (analysis.perplexity, as the lm family's evaluation sums them):
perplexity is exp(mean cross-entropy), per frequency bin and per position bin, computed here one
paragraph at a time. The tiny corpus comes from tests/corpus/test_lm.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from gradscope.analysis.perplexity import FREQ_LABELS, PerplexityCounts, position_edges
from gradscope.corpus import frequency_bins
from gradscope.models import SeqModel
from gradscope.tasks import make_task
from gradscope.workflows.families.lm import evaluate_lm

from tests.corpus.test_lm import corpus_dir, lm_config  # noqa: F401 - the fixture


def test_perplexity_is_exp_mean_cross_entropy_computed_independently(corpus_dir: Path) -> None:
    cfg = lm_config(corpus_dir, length=16)
    task = make_task(cfg.task)
    torch.manual_seed(1)
    model = SeqModel(cfg.model).eval()
    counts, preds, targets, types = evaluate_lm(model, task, torch.device("cpu"))
    # independent: one unpadded paragraph at a time, float64 log-softmax of the model's logits
    test = task.corpus.splits["test"]
    losses, hits, ids, positions = [], [], [], []
    for i in range(len(test)):
        words = torch.from_numpy(test.paragraph(i)[:16]).long()
        inputs = torch.cat([torch.tensor([task.query]), words[:-1]])[None]
        with torch.no_grad():
            logits = model(inputs)[0].double()
        losses.append(torch.nn.functional.cross_entropy(logits, words, reduction="none"))
        hits.append(logits.argmax(-1) == words)
        ids.append(words)
        positions.append(torch.arange(1, words.numel() + 1))
    loss, hit, tok, pos = (torch.cat(v).numpy() for v in (losses, hits, ids, positions))
    assert counts.n == loss.size and counts.correct == int(hit.sum())
    assert math.isclose(counts.perplexity, math.exp(loss.mean()), rel_tol=1e-5)
    bins10 = frequency_bins(task.corpus.counts, 10)
    for d in range(10):
        sel = bins10[tok] == d
        b = FREQ_LABELS.index(f"decile{d + 1}")
        assert counts.freq_n[b] == sel.sum()
        assert math.isclose(counts.freq_nll[b], loss[sel].sum(), rel_tol=1e-5, abs_tol=1e-6)
    halves = frequency_bins(task.corpus.counts, 2)
    assert counts.freq_n[0] + counts.freq_n[1] == counts.n and counts.freq_n[1] == (halves[tok] == 1).sum()
    for j, (a, b) in enumerate(position_edges(16)):
        sel = (pos >= a) & (pos <= b)
        assert counts.pos_n[j] == sel.sum() and math.isclose(counts.pos_nll[j], loss[sel].sum(), rel_tol=1e-5)
    assert list(types) == [30, 30] + [6] * 10  # token types per bin: two halves and ten deciles of 60


def test_the_sums_as_arrays_are_the_store_part_and_add_up() -> None:
    edges = tuple(position_edges(4))
    one = PerplexityCounts(2.5, 3, 1, np.arange(12.0), np.arange(12), np.ones(12, dtype=np.int64),
                           np.ones(len(edges)), np.full(len(edges), 2), np.zeros(len(edges), dtype=np.int64), edges)
    both = one + one
    assert (both.nll, both.n, both.correct) == (5.0, 6, 2) and math.isclose(both.perplexity, math.exp(5.0 / 6))
    part = both.arrays(np.full(12, 7))
    assert set(part) == {"nll", "n", "correct", "freq_nll", "freq_n", "freq_correct", "pos_nll", "pos_n",
                         "pos_correct", "edges", "labels", "types"}
    assert part["nll"].dtype == np.float64 and part["n"].dtype == np.int64 and part["n"] == 6
    assert part["edges"].shape == (len(edges), 2) and part["edges"].tolist() == [list(e) for e in edges]
    assert list(part["labels"]) == list(FREQ_LABELS) and part["types"].tolist() == [7] * 12
    assert np.array_equal(part["freq_nll"], 2 * np.arange(12.0))
