"""The lm family's evaluation (issue #27; moved here from gradscope/workflows/lm.py, issue #39): every
paragraph of the corpus's test split (first L tokens, as in training) is scored; the result carries the
usual token/sequence counts, and as the family's own counts the cross-entropy sums overall, by
frequency bin and by position bin, which :meth:`gradscope.tasks.lm.LanguageModel.accuracy_part` turns
into perplexities. The raw-text path (gradscope/workflows/text_accuracy.py) stores its counts the same
way (:func:`lm_part`)."""

from __future__ import annotations

import numpy as np
import torch

from gradscope.analysis.accuracy import token_correct
from gradscope.analysis.distance import sequence_dl_distances
from gradscope.analysis.lm import LMCounts, lm_counts, position_edges, rows_per_chunk, token_bins, token_nll
from gradscope.errors import GradscopeError
from gradscope.files.checkpoint import Loaded
from gradscope.store.records import AccuracyResult
from gradscope.tasks.lm import LanguageModel
from gradscope.workflows.families.evaluation import Evaluation
from gradscope.workflows.families.tokens import tokens_dataset
from gradscope.workflows.lm import lm_task
from gradscope.workflows.options import AccuracyOptions


def evaluate_lm(model: torch.nn.Module, task: LanguageModel, device: torch.device, split: str = "test"
                ) -> tuple[LMCounts, torch.Tensor, torch.Tensor, np.ndarray]:
    """Score every paragraph of ``split``: (counts, predictions (n, L), targets (n, L), types per
    frequency bin (12,)). Rows go through the model in chunks bounded by their logits' memory."""
    corpus = task.corpus
    length = task.cfg.length
    bins = token_bins(corpus.counts)
    edges = position_edges(length)
    n = len(corpus.splits[split])
    chunk = rows_per_chunk(length, task.num_classes)
    total: LMCounts | None = None
    preds, targets = [], []
    model.eval()
    for start in range(0, n, chunk):
        batch = task.rows(split, np.arange(start, min(n, start + chunk)), width=length)
        nll, pred = token_nll(model, batch.inputs.to(device), batch.targets.to(device))
        part = lm_counts(nll, pred, batch.targets, bins, edges)
        total = part if total is None else total + part
        preds.append(pred.cpu())
        targets.append(batch.targets)
    if total is None:  # open_corpus refuses such a split; a corpus object built by hand may still have one
        raise GradscopeError(f"corpus: {corpus.path}'s {split} split has no paragraph to score")
    return total, torch.cat(preds), torch.cat(targets), bins.sum(1)


def lm_part(counts: LMCounts, types: np.ndarray) -> dict[str, np.ndarray]:
    """The lm family's own counts of one checkpoint (what its ``accuracy_part`` reads): the sums of
    ``counts``, its bins' labels and position edges (P, 2), and ``types`` (token types per frequency bin)."""
    return {"nll": np.float64(counts.nll), "n": np.int64(counts.n), "correct": np.int64(counts.correct),
            "freq_nll": counts.freq_nll, "freq_n": counts.freq_n, "freq_correct": counts.freq_correct,
            "pos_nll": counts.pos_nll, "pos_n": counts.pos_n, "pos_correct": counts.pos_correct,
            "edges": np.array([[a, b] for a, b in counts.edges], dtype=np.int64).reshape(-1, 2),
            "labels": np.asarray(counts.labels, dtype=object), "types": np.asarray(types)}


def evaluate_lm_checkpoint(loaded: Loaded, opts: AccuracyOptions, device: torch.device) -> AccuracyResult:
    """An :class:`AccuracyResult` of an lm checkpoint on its corpus's test split (``opts.corpus``: the
    corpus's directory if it moved)."""
    task = lm_task(loaded, opts.corpus)
    model = loaded.model.to(device)
    counts, preds, targets, types = evaluate_lm(model, task, device)
    model.to("cpu")
    correct, scored = token_correct(preds, targets)
    return AccuracyResult(
        loaded.path, loaded.iteration, loaded.path.parent.name,
        correct.sum(1).numpy(), scored.sum(1).numpy(), sequence_dl_distances(preds, targets).astype(np.float64),
        correct.sum(0).numpy(), scored.sum(0).numpy(), family=lm_part(counts, types))


# its store is the token part and its own, with the options attribute of a token store (as before #39)
LM = Evaluation(options=("corpus",), evaluate=evaluate_lm_checkpoint, dataset=tokens_dataset)
