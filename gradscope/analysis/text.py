"""Perplexity and accuracy of a pretrained LM on raw text: frequency bins of a text's
token types, the windows long paragraphs are scored in, per-token cross-entropy from logits, sums
per paragraph (the bootstrap's unit) and their bootstrap intervals. Pure functions on arrays.

Frequency bins: the types that occur in the counts text, sorted by count (most frequent first, ties
by id), cut into equal quantiles of types exactly as the language-model task cuts a corpus's vocabulary
(:func:`gradscope.analysis.perplexity.token_bins`: frequent/rare halves, deciles); a type that never occurs
in the counts text is in bin ``unseen`` (rarer than any seen; empty when the counts come from the
scored text itself).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from gradscope.analysis.perplexity import FREQ_LABELS
from gradscope.corpus.store import frequency_ranks
from gradscope.errors import check
from gradscope.fields import CONFIDENCE

TEXT_FREQ_LABELS = (*FREQ_LABELS, "unseen")


def text_bins(counts: np.ndarray) -> np.ndarray:
    """(13, K) bool: row b says which ids fall in bin TEXT_FREQ_LABELS[b] (module docstring)."""
    counts = np.asarray(counts)
    seen = counts > 0
    k = int(seen.sum())
    check(k >= 2, f"counts_text: only {k} token type(s) occur in it; frequency bins need at least 2")
    ranks = frequency_ranks(counts)  # seen types rank 0 … k − 1 (every count > 0 beats 0)
    halves, deciles = (ranks * 2) // k, (ranks * 10) // k
    rows = [seen & (halves == 0), seen & (halves == 1)] + [seen & (deciles == d) for d in range(10)] + [~seen]
    return np.stack(rows)


def windows(n: int, max_length: int) -> list[tuple[int, int, int]]:
    """How a sequence of ``n`` tokens (the start token, if any, then the paragraph) is scored in rows
    of at most ``max_length`` tokens: (a, b, first) per row — the row is tokens[a:b] and scores the
    predictions of targets tokens[first:b] (index j predicted from tokens[a:j]). The first row starts
    at 0; each next one starts ``max_length // 2`` tokens later and scores only the targets the rows
    before it did not, so every target is scored once, with at least max_length − max_length // 2
    tokens before it in its row (all of them when the paragraph fits)."""
    check(max_length >= 2, f"max_length: got {max_length}; a row needs at least 2 tokens")
    stride = max_length // 2
    out, a, done = [], 0, 1
    while done < n:
        b = min(n, a + max_length)
        out.append((a, b, done))
        done = b
        a += stride
    return out


def target_nll(logits: torch.Tensor, targets: torch.Tensor, budget: int = 1 << 24) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy (float64, nats) and argmax of logits (n, T, V) at targets (n, T) (every entry
    scored by the caller's mask), the log-softmax in float64 over slices of at most ``budget``
    elements: (n, T), (n, T)."""
    n, t, v = logits.shape
    step = max(1, budget // max(1, n * v))
    nll = torch.empty(n, t, dtype=torch.float64)
    pred = torch.empty(n, t, dtype=torch.long)
    for s in range(0, t, step):
        part = logits[:, s:s + step].double()  # (n, t', V)
        logp = torch.log_softmax(part, dim=-1)
        nll[:, s:s + step] = -logp.gather(-1, targets[:, s:s + step, None].clamp(min=0))[..., 0].cpu()
        pred[:, s:s + step] = part.argmax(-1).cpu()
    return nll, pred


def column_sums(paragraph: np.ndarray, member: np.ndarray, values: np.ndarray, n_paragraphs: int) -> np.ndarray:
    """(n_paragraphs, C) sums of ``values`` (m,) over the tokens of each paragraph (``paragraph`` (m,)
    ids) that are members of each column (``member`` (C, m) bool)."""
    c = member.shape[0]
    rows, cols = np.nonzero(member.T)  # token, column
    flat = paragraph[rows] * c + cols
    return np.bincount(flat, weights=values[rows], minlength=n_paragraphs * c).reshape(n_paragraphs, c)


def ratio_interval(num: np.ndarray, den: np.ndarray, *, log_scale: bool, resamples: int, seed: int,
                   confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """Percentile-bootstrap bounds (low, high), each (C,), of sum(num)/sum(den) per column (exp of it
    when ``log_scale``: a perplexity), resampling rows (paragraphs) of num, den (P, C) together with
    scipy.stats.bootstrap, ``numpy.random.default_rng(seed)``. NaN where a column has fewer than
    two paragraphs with a scored token, or where a resample holds no token of it."""
    from scipy import stats  # on first use (start-up time)

    num, den = np.asarray(num, dtype=np.float64).T, np.asarray(den, dtype=np.float64).T  # (C, P)
    low, high = np.full(num.shape[0], np.nan), np.full(num.shape[0], np.nan)
    ok = (den > 0).sum(1) >= 2
    if not ok.any() or num.shape[1] < 2:
        return low, high

    def statistic(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            r = a.sum(axis) / b.sum(axis)
        return np.exp(r) if log_scale else r

    a, b = num[ok], den[ok]
    batch = max(1, (1 << 24) // max(1, a.size))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate columns give NaN bounds, said in the docs
        res = stats.bootstrap((a, b), statistic, paired=True, vectorized=True, axis=-1, n_resamples=resamples,
                              batch=batch, method="percentile", confidence_level=confidence,
                              rng=np.random.default_rng(seed))
    low[ok], high[ok] = res.confidence_interval.low, res.confidence_interval.high
    return low, high
