"""``lm``: language modelling on a prepared text corpus (paper appendix E).

One row is one paragraph of the corpus, truncated to its first L tokens (``length``; the paper used
L = 1,024 on WikiText-103), so the positional encoding restarts at t = 0 with every paragraph:

    inputs  = [q, w_1, …, w_{m−1}, q, …, q]      q = the query token K, read as "start of paragraph"
    targets = [w_1, …, w_m, ·, …, ·]             · = unscored (padding), m = min(L, paragraph length)

so every token of the paragraph is predicted, the first one from the start token alone. Training
rows are paragraphs of the train split drawn uniformly with replacement from the run's generator,
padded to the batch's longest row; the held-out rows stored in checkpoints are the first
``heldout_size`` paragraphs of the valid split, padded to L. Test perplexity uses the test split
(:mod:`gradscope.workflows.families.lm`). The splits are disjoint by paragraph, so no training row is
compared against the held-out set.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping, Sequence

import numpy as np
import torch

from gradscope.corpus.store import Corpus, Split, open_corpus
from gradscope.errors import check
from gradscope.tasks.base import IGNORE, Batch, Cfg, Task
from gradscope.tasks.family import (COUNT, FLOAT, INT, STR, Metrics, Panel, Part, ReportSection, Variable, perplexity,
                                    ratio, stack)
from gradscope.tasks.fields import TaskFields


def paragraph_rows(split: Split, index: np.ndarray, length: int, start: int, width: int | None = None) -> Batch:
    """Rows for paragraphs ``index`` (n,) of ``split``: the first ``length`` tokens of each, as
    start-token-prefixed inputs and next-token targets (module docstring), padded with ``start``
    (inputs) and IGNORE (targets) to ``width`` columns (default: the longest row). Vectorised: one
    gather from the memory-mapped token array."""
    index = np.asarray(index, dtype=np.int64)
    m = np.minimum(split.lengths[index], length)  # (n,)
    width = int(m.max(initial=1)) if width is None else width
    col = np.arange(width)[None, :]  # (1, W)
    inside = col < m[:, None]  # (n, W)
    pos = np.where(inside, split.offsets[index][:, None] + col, 0)
    words = torch.from_numpy(np.asarray(split.tokens[pos.ravel()], dtype=np.int64).reshape(pos.shape))
    inside_t = torch.from_numpy(inside)
    targets = torch.where(inside_t, words, IGNORE)
    shifted = torch.cat([torch.full((len(index), 1), start, dtype=torch.long), words[:, :-1]], dim=1)
    inputs = torch.where(inside_t, shifted, start)  # (n, W): the start token, then the paragraph
    return Batch(inputs, targets)


class LanguageModel(Task):
    name: ClassVar[str] = "lm"
    settings: ClassVar[tuple[str, ...]] = ("corpus",)  # its tokens follow the corpus
    padded_rows: ClassVar[bool] = True  # a paragraph per row, padded (its probe source: workflows.families.lm)
    disjoint_heldout: ClassVar[bool] = True
    # its own part of the accuracy store: perplexity and accuracy on the corpus's test split, overall, by
    # token-frequency bin and by position bin (evaluated by gradscope.workflows.families.lm; the raw-text
    # path's stores, task "text", are read as this family: tasks.registry.READ_AS)
    layout = {"perplexity": Variable(dims=("checkpoint",), kind=FLOAT),
              "cross_entropy": Variable(dims=("checkpoint",), kind=FLOAT),
              "freq_perplexity": Variable(dims=("checkpoint", "freq_bin"), kind=FLOAT),
              "freq_accuracy": Variable(dims=("checkpoint", "freq_bin"), kind=FLOAT),
              "freq_n": Variable(dims=("freq_bin",), kind=COUNT),
              "pos_perplexity": Variable(dims=("checkpoint", "pos_bin"), kind=FLOAT),
              "pos_accuracy": Variable(dims=("checkpoint", "pos_bin"), kind=FLOAT),
              "pos_n": Variable(dims=("pos_bin",), kind=COUNT),
              "freq_bin": Variable(dims=("freq_bin",), kind=STR), "freq_types": Variable(dims=("freq_bin",), kind=COUNT),
              "pos_bin": Variable(dims=("pos_bin",), kind=INT), "pos_start": Variable(dims=("pos_bin",), kind=INT),
              "pos_end": Variable(dims=("pos_bin",), kind=INT)}
    needs = {"freq_bin": ("freq_bin",), "pos_bin": ("pos_bin", "pos_start", "pos_end")}
    report = ReportSection(
        heading="Language model: perplexity by token frequency and position",
        text="Test perplexity on the corpus's test split (raw-text stores: on the text) by token-frequency decile "
             "(1 = the most frequent tenth of the token types by train count) and by target-position bin. Lines: "
             "mean over seeds; bars: lowest to highest seed (docs/lm.md).",
        panels=(Panel(variable="freq_perplexity", x="freq_bin", x_only="decile", log_y=True,
                      title="by token-frequency decile (train counts)", x_title="frequency decile",
                      y_title="test perplexity"),
                Panel(variable="pos_perplexity", x="pos_bin", x_ticks=("pos_start", "pos_end"), log_y=True,
                      title="by target position in the paragraph", x_title="positions", y_title="test perplexity")))
    tiny = None  # a run needs a prepared corpus (tests/corpus/test_lm.py makes one)
    default_length: ClassVar[int | None] = 1024  # the paper's first 1,024 tokens of each paragraph

    @classmethod
    def check_config(cls, cfg: TaskFields) -> None:
        check(bool(cfg.corpus), "corpus: the lm task needs a corpus directory (make one with "
                                "`gradscope corpus prepare RAW.txt -o DIR`, then pass --corpus DIR)")
        check(cfg.distribution == "uniform",
              f"distribution: got {cfg.distribution!r}; the lm task's tokens follow its corpus (uniform sampling "
              f"of paragraphs, no dual distribution)")

    @classmethod
    def resolve(cls, cfg: Cfg) -> Cfg:
        """``cfg`` with the corpus path made absolute, the vocabulary size and corpus sha256 read
        from its manifest, and ``heldout_size`` capped at the valid split's paragraph count."""
        corpus = open_corpus(cfg.corpus)
        return dataclasses.replace(cfg, corpus=str(corpus.path), vocab_size=corpus.vocab_size,
                                   corpus_sha256=corpus.sha256, distribution="uniform",
                                   heldout_size=min(cfg.heldout_size, len(corpus.splits["valid"])))

    @property
    def corpus(self) -> Corpus:
        corpus = open_corpus(self.cfg.corpus)
        check(corpus.vocab_size == self.cfg.vocab_size,
              f"corpus: {corpus.path} has {corpus.vocab_size} tokens; this run's vocabulary is {self.cfg.vocab_size}")
        check(not self.cfg.corpus_sha256 or corpus.sha256 == self.cfg.corpus_sha256,
              f"corpus: {corpus.path} is not the corpus this run was made with (its manifest's sha256 differs); "
              f"give the original corpus")
        return corpus

    @property
    def total_len(self) -> int:
        return self.cfg.length

    def n_patterns(self) -> int:
        return len(self.corpus.splits["train"])

    def rows(self, split: str, index: np.ndarray, width: int | None = None) -> Batch:
        """Rows for paragraphs ``index`` of ``split`` (train, valid or test)."""
        return paragraph_rows(self.corpus.splits[split], index, self.cfg.length, self.query, width)

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        count = len(self.corpus.splits["train"])
        index = torch.randint(0, count, (n,), generator=gen, device=gen.device).cpu().numpy()
        return self.rows("train", index).to(gen.device)

    def heldout_batch(self) -> Batch | None:
        valid = self.corpus.splits["valid"]
        check(self.cfg.heldout_size <= len(valid),
              f"heldout_size: got {self.cfg.heldout_size}; the corpus's valid split has {len(valid)} paragraphs")
        return self.rows("valid", np.arange(self.cfg.heldout_size), width=self.cfg.length)

    # --- its own part of the accuracy store (the counts: gradscope.analysis.perplexity.PerplexityCounts.arrays) ---

    @classmethod
    def accuracy_part(cls, counts: Sequence[Mapping[str, np.ndarray]]) -> tuple[Part, Part]:
        """Perplexity and accuracy per checkpoint: overall, by frequency bin and by position bin, from
        each checkpoint's cross-entropy sums (nll, n, correct; freq_* and pos_* per bin), the bins'
        ``labels``, position ``edges`` (P, 2) and token ``types`` per frequency bin."""
        counts = list(counts)
        first = counts[0]
        edges = np.asarray(first["edges"])
        data: Part = {
            "perplexity": ("checkpoint", np.array([perplexity(c["nll"], c["n"]) for c in counts])),
            "cross_entropy": ("checkpoint", np.array([c["nll"] / c["n"] if c["n"] else np.nan for c in counts])),
            "freq_perplexity": (("checkpoint", "freq_bin"), perplexity(stack(counts, "freq_nll"), stack(counts, "freq_n"))),
            "freq_accuracy": (("checkpoint", "freq_bin"), ratio(stack(counts, "freq_correct"), stack(counts, "freq_n"))),
            "freq_n": ("freq_bin", first["freq_n"]),
            "pos_perplexity": (("checkpoint", "pos_bin"), perplexity(stack(counts, "pos_nll"), stack(counts, "pos_n"))),
            "pos_accuracy": (("checkpoint", "pos_bin"), ratio(stack(counts, "pos_correct"), stack(counts, "pos_n"))),
            "pos_n": ("pos_bin", first["pos_n"]),
        }
        coords: Part = {"freq_bin": np.asarray(first["labels"], dtype=object), "freq_types": ("freq_bin", first["types"]),
                        "pos_bin": np.arange(len(edges)), "pos_start": ("pos_bin", edges[:, 0]),
                        "pos_end": ("pos_bin", edges[:, 1])}
        return data, coords

    @classmethod
    def summary_metrics(cls, last: Mapping[str, np.ndarray]) -> Metrics:
        """Perplexity overall, per frequency bin (with its token accuracy) and per position bin; per-seed
        values only (a perplexity has no per-token unit)."""
        metrics = {"perplexity": float(last["perplexity"])}
        for label, ppl, acc in zip(last["freq_bin"], last["freq_perplexity"], last["freq_accuracy"]):
            metrics[f"perplexity/{label}"], metrics[f"token_accuracy/{label}"] = float(ppl), float(acc)
        for a, b, ppl in zip(last["pos_start"], last["pos_end"], last["pos_perplexity"]):
            metrics[f"perplexity/t{a}-{b}"] = float(ppl)
        return metrics, {}

    @classmethod
    def lines(cls, last: Mapping[str, np.ndarray]) -> list[str]:
        """Test perplexity and token accuracy: overall, by frequency bin and by position bin."""
        n, acc = np.asarray(last["pos_n"]), np.asarray(last["pos_accuracy"], dtype=np.float64)
        hits = float(np.nansum(acc * n))
        rows = [("all", int(n.sum()), float(last["perplexity"]), hits / n.sum() if n.sum() else float("nan"))]
        rows += [(str(b), int(k), float(p), float(a)) for b, k, p, a in
                 zip(last["freq_bin"], last["freq_n"], last["freq_perplexity"], last["freq_accuracy"])]
        rows += [(f"positions {a}–{b}", int(k), float(p), float(c)) for a, b, k, p, c in
                 zip(last["pos_start"], last["pos_end"], last["pos_n"], last["pos_perplexity"], last["pos_accuracy"])]
        return [f"test split ({int(n.sum())} scored tokens): perplexity and token accuracy",
                f"  {'tokens':<16} {'n':>7} {'perplexity':>11} {'token accuracy':>15}",
                *(f"  {label:<16} {k:>7} {p:>11.2f} {a:>15.4f}" for label, k, p, a in rows)]
