"""A language model's scores: per-token cross-entropy, perplexity and accuracy, overall,
by token-frequency bin and by position bin. Pure functions on tensors and arrays, split into an
update step (:func:`perplexity_counts` per chunk of rows) and a compute step (:func:`perplexity`).

Perplexity = exp(mean cross-entropy, natural log, over the scored target tokens). A frequency
bin's perplexity averages over the target tokens whose id falls in that bin; bins are quantiles of
token types by train count (:func:`gradscope.corpus.frequency_bins`): the frequent and rare halves,
then deciles (decile 1 the most frequent). Position bins group target positions (1-based: position
1 is the paragraph's first token, predicted from the start token alone) into 1, 2–3, 4–7, 8–15, …
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from gradscope.corpus.store import frequency_bins
from gradscope.errors import check
from gradscope.tasks.base import IGNORE
from gradscope.tasks.family import perplexity  # moved down: the lm family's store part computes it

FREQ_LABELS = ("frequent", "rare", *(f"decile{i}" for i in range(1, 11)))


def position_edges(length: int) -> list[tuple[int, int]]:
    """Position bins [start, end] (1-based, inclusive) covering 1…length: 1, 2–3, 4–7, 8–15, …"""
    check(length >= 1, f"length: got {length}; need at least 1")
    edges, start = [], 1
    while start <= length:
        edges.append((start, min(2 * start - 1, length)))
        start *= 2
    return edges


def token_bins(counts: np.ndarray) -> np.ndarray:
    """(12, K) bool: row b says which token ids fall in frequency bin FREQ_LABELS[b]."""
    halves, deciles = frequency_bins(counts, 2), frequency_bins(counts, 10)
    rows = [halves == 0, halves == 1] + [deciles == d for d in range(10)]
    return np.stack(rows)


@dataclass(frozen=True)
class PerplexityCounts:
    """Sums over scored target tokens: ``nll`` (float64, nats), ``n`` tokens, ``correct`` argmax
    hits; the same per frequency bin (12: FREQ_LABELS) and per position bin (``edges``)."""

    nll: float
    n: int
    correct: int
    freq_nll: np.ndarray
    freq_n: np.ndarray
    freq_correct: np.ndarray
    pos_nll: np.ndarray
    pos_n: np.ndarray
    pos_correct: np.ndarray
    edges: tuple[tuple[int, int], ...]
    labels: tuple[str, ...] = FREQ_LABELS  # the frequency bins' names (raw text adds "unseen": analysis/text.py)

    def __add__(self, other: "PerplexityCounts") -> "PerplexityCounts":
        check(self.edges == other.edges and self.labels == other.labels, "PerplexityCounts: bins differ")
        return PerplexityCounts(self.nll + other.nll, self.n + other.n, self.correct + other.correct,
                        self.freq_nll + other.freq_nll, self.freq_n + other.freq_n,
                        self.freq_correct + other.freq_correct, self.pos_nll + other.pos_nll,
                        self.pos_n + other.pos_n, self.pos_correct + other.pos_correct, self.edges, self.labels)

    @property
    def perplexity(self) -> float:
        return perplexity(self.nll, self.n)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else float("nan")

    def arrays(self, types: np.ndarray) -> dict[str, np.ndarray]:
        """The sums as plain arrays, with the bins' labels, the position edges (P, 2) and ``types`` (token types per
        frequency bin): an accuracy store's part of a language model (its family's ``accuracy_part`` reads them,
        and a text's store is read as that family, gradscope.tasks.registry.READ_AS)."""
        return {"nll": np.float64(self.nll), "n": np.int64(self.n), "correct": np.int64(self.correct),
                "freq_nll": self.freq_nll, "freq_n": self.freq_n, "freq_correct": self.freq_correct,
                "pos_nll": self.pos_nll, "pos_n": self.pos_n, "pos_correct": self.pos_correct,
                "edges": np.array([[a, b] for a, b in self.edges], dtype=np.int64).reshape(-1, 2),
                "labels": np.asarray(self.labels, dtype=object), "types": np.asarray(types)}


@torch.no_grad()
def token_nll(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position cross-entropy (float64, nats; 0 where unscored) and argmax predictions of
    ``model`` (token ids (n, T) → logits (n, T, K)) on one chunk: (n, T), (n, T)."""
    logits = model(inputs).double()  # (n, T, K)
    logp = torch.log_softmax(logits, dim=-1)
    scored = targets != IGNORE
    nll = -logp.gather(-1, targets.clamp(min=0)[..., None])[..., 0]  # (n, T)
    return torch.where(scored, nll, 0.0), logits.argmax(-1)


def perplexity_counts(nll: torch.Tensor, preds: torch.Tensor, targets: torch.Tensor, bins: np.ndarray,
              edges: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> PerplexityCounts:
    """The update step: sums of one chunk. nll, preds, targets (n, T); bins (12, K) from
    :func:`token_bins`; ``edges`` from :func:`position_edges` (position = column + 1)."""
    scored = (targets != IGNORE).cpu()
    tgt = targets.cpu()[scored].numpy()
    loss = nll.cpu()[scored].numpy().astype(np.float64)
    hit = (preds.cpu() == targets.cpu())[scored].numpy()
    pos = (torch.nonzero(scored)[:, 1] + 1).numpy()
    member = bins[:, tgt]  # (12, m)
    pos_bin = np.stack([(pos >= a) & (pos <= b) for a, b in edges])  # (P, m)
    return PerplexityCounts(float(loss.sum()), int(loss.size), int(hit.sum()),
                    (member * loss).sum(1), member.sum(1).astype(np.int64), (member & hit).sum(1).astype(np.int64),
                    (pos_bin * loss).sum(1), pos_bin.sum(1).astype(np.int64), (pos_bin & hit).sum(1).astype(np.int64),
                    tuple(tuple(e) for e in edges))


def rows_per_chunk(width: int, vocab: int, budget: int = 1 << 27) -> int:
    """Rows whose float64 logits (width × vocab each, three copies) stay within ``budget`` bytes."""
    return max(1, budget // max(1, 3 * 8 * width * vocab))

