"""The lm family's workflows half.

Evaluation: every paragraph of the corpus's test split (first L tokens, as in training) is scored; the
result carries the usual token/sequence counts, and as the family's own counts the cross-entropy sums
overall, by frequency bin and by position bin, which :meth:`gradscope.tasks.lm.LanguageModel.accuracy_part`
turns into perplexities. The raw-text path (gradscope/workflows/text/accuracy.py) stores its counts the
same way (:meth:`~gradscope.analysis.perplexity.PerplexityCounts.arrays`).

Probe source: stability's triplets and dynamics' sequences and trajectories are the corpus's own text
(:func:`lm_probes`, :func:`lm_sequences`, :func:`lm_trajectories`), declared as the family's
:class:`~gradscope.workflows.families.evaluation.TextProbes`, which gradscope/workflows/stability.py and
dynamics.py call without naming the family."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from gradscope.analysis.accuracy import token_correct
from gradscope.analysis.distance import sequence_dl_distances
from gradscope.analysis.perplexity import PerplexityCounts, perplexity_counts, position_edges, rows_per_chunk, token_bins, token_nll
from gradscope.corpus.store import Corpus, frequency_bins
from gradscope.errors import GradscopeError, check
from gradscope.tasks import make_task
from gradscope.tasks.probes import Probes
from gradscope.files.checkpoint import Loaded
from gradscope.store.records import AccuracyResult
from gradscope.tasks.lm import LanguageModel
from gradscope.workflows.families.evaluation import Evaluation, TextProbes
from gradscope.workflows.families.lm_options import LMOptions
from gradscope.workflows.families.options import option_names
from gradscope.workflows.families.tokens import tokens_dataset
from gradscope.workflows.options import AccuracyOptions


PROBE_GROUPS = ("frequent", "rare")
TEXT = "text"  # the disturbant label of probes on real text: the surrounding tokens are the corpus's own


def lm_task(loaded: Loaded, opts: LMOptions | None = None) -> LanguageModel:
    """The checkpoint's lm task, reading the family's own option ``opts.corpus`` (``opts``: a command's options,
    which hold every family's) instead of the recorded path when given (a moved corpus; its manifest must still
    match the run's)."""
    cfg = loaded.config.task
    if opts is not None and opts.corpus is not None:
        cfg = replace(cfg, corpus=str(Path(opts.corpus).resolve()))
    task = make_task(cfg)
    check(isinstance(task, LanguageModel), f"checkpoint: {loaded.path} is not a language model (task {cfg.name!r})")
    return task


def _class_of(corpus: Corpus) -> np.ndarray:
    """(K,) 0 = frequent half, 1 = rare half of the token types by train count."""
    return frequency_bins(corpus.counts, 2)


def check_probe_shape(position: int, length: int, longest: int, length_name: str = "length") -> None:
    """A probe row of ``length`` tokens (start token included, at most ``longest``) with its target at
    paragraph token ``position``."""
    check(2 <= length <= longest, f"{length_name}: got {length}; probes on this checkpoint take 2…{longest}")
    check(1 <= position <= length - 1, f"target_pos: got {position}; valid positions are 1…{length - 1} (paragraph "
                                       f"tokens of a probe of length {length})")


def lm_probes(task: LanguageModel, n: int, position: int, length: int, groups: tuple[str, ...],
              seed: int) -> Probes:
    """``n`` probe triplets per target class in ``groups`` (frequent, rare: the halves of the
    vocabulary's token types by train count), drawn from the corpus's test split with
    ``numpy.random.default_rng(seed)``.

    A probe row is the model's own input row: the start token, then the first ``length − 1`` tokens
    of a test paragraph; ``position`` (1-based) counts paragraph tokens, so the target sits in
    column ``position`` of the row. Eligible paragraphs, per class c: at least ``length − 1``
    tokens, and the token at ``position`` of class c. Per triplet:

    - base (P, x, S): an eligible paragraph A, drawn uniformly; x = A's token at ``position``;
    - same-target (P, x, S′): A's prefix and target, then the tokens that follow ``position`` in
      another eligible paragraph C ≠ A (uniform): a real continuation after a class-c token at the
      same position;
    - same-suffix (P′, x′, S): the prefix and target of another eligible paragraph B ≠ A whose
      target token differs from x (uniform among those; B ≠ A only when no such paragraph exists),
      then A's suffix.

    Disturbants are real text, so the condition label is ``<class>/text``.
    """
    corpus = task.corpus
    test = corpus.splits["test"]
    check_probe_shape(position, length, task.cfg.length)
    for g in groups:
        check(g in PROBE_GROUPS, f"target_freq: got {g!r}; lm probes take {', '.join(PROBE_GROUPS)}")
    klass = _class_of(corpus)
    long_enough = np.flatnonzero(test.lengths >= length - 1)
    rows = task.rows("test", long_enough, width=length).inputs  # (m, length)
    target = rows[:, position].numpy()
    rng = np.random.default_rng(seed)
    out, labels = [], []
    for g in groups:
        eligible = np.flatnonzero(klass[target] == PROBE_GROUPS.index(g))
        check(eligible.size >= 2, f"position: only {eligible.size} test paragraph(s) of at least {length - 1} tokens have "
                                  f"a {g} token at position {position}; need 2 (choose another position or length)")
        a = rng.choice(eligible, n)
        c = np.array([rng.choice(eligible[eligible != i]) for i in a])
        b = []
        for i in a:
            other = eligible[(target[eligible] != target[i]) & (eligible != i)]
            b.append(rng.choice(other if other.size else eligible[eligible != i]))
        base = rows[a]
        same_target = base.clone()
        same_target[:, position + 1:] = rows[c][:, position + 1:]
        same_suffix = base.clone()
        same_suffix[:, :position + 1] = rows[np.array(b)][:, :position + 1]
        out.append(torch.stack([base, same_target, same_suffix], dim=1))
        labels += [g] * n
    return Probes(torch.cat(out), tuple(labels), (TEXT,) * len(labels))



def lm_sequences(task: LanguageModel, n: int, seed: int) -> torch.Tensor:
    """``n`` model input rows (n, L) of test paragraphs with at least L − 1 tokens (the start token,
    then the paragraph), drawn without replacement (with, if fewer exist) by ``default_rng(seed)``:
    the dynamics workflow's probe sequences on an lm checkpoint."""
    test = task.corpus.splits["test"]
    length = task.cfg.length
    eligible = np.flatnonzero(test.lengths >= length - 1)
    check(eligible.size >= 1, f"sequences: the test split has no paragraph of at least {length - 1} tokens")
    rng = np.random.default_rng(seed)
    pick = rng.choice(eligible, n, replace=eligible.size < n)
    return task.rows("test", pick, width=length).inputs


def lm_token_classes(tokens: torch.Tensor, task: LanguageModel) -> np.ndarray:
    """'frequent' / 'rare' (halves of the token types by train count) or 'start' per token id."""
    klass = _class_of(task.corpus)
    t = tokens.numpy()
    out = np.where(klass[np.minimum(t, task.num_classes - 1)] == 0, "frequent", "rare").astype(object)
    out[t == task.query] = "start"
    return out


@torch.no_grad()
def lm_trajectories(model: torch.nn.Module, task: LanguageModel, steps: int, n: int, seed: int) -> torch.Tensor:
    """Core inputs (n, steps, in) of long trajectories on real text: consecutive test paragraphs
    (each its start token then its first L − 1 tokens, PE restarting with each) back to back, from
    a start paragraph drawn by ``default_rng(seed)``, wrapping round the split."""
    test = task.corpus.splits["test"]
    device = next(model.parameters()).device
    rng = np.random.default_rng(seed)
    out = []
    for start in rng.integers(0, len(test), n):
        parts, have, i = [], 0, int(start)
        while have < steps:
            batch = task.rows("test", np.array([i % len(test)]))
            x = model.core_inputs(batch.inputs.to(device))[0]  # (m, in): every column is a real token
            parts.append(x)
            have += x.shape[0]
            i += 1
        out.append(torch.cat(parts)[:steps])
    return torch.stack(out)


def evaluate_lm(model: torch.nn.Module, task: LanguageModel, device: torch.device, split: str = "test"
                ) -> tuple[PerplexityCounts, torch.Tensor, torch.Tensor, np.ndarray]:
    """Score every paragraph of ``split``: (counts, predictions (n, L), targets (n, L), types per
    frequency bin (12,)). Rows go through the model in chunks bounded by their logits' memory."""
    corpus = task.corpus
    length = task.cfg.length
    bins = token_bins(corpus.counts)
    edges = position_edges(length)
    n = len(corpus.splits[split])
    chunk = rows_per_chunk(length, task.num_classes)
    total: PerplexityCounts | None = None
    preds, targets = [], []
    model.eval()
    for start in range(0, n, chunk):
        batch = task.rows(split, np.arange(start, min(n, start + chunk)), width=length)
        nll, pred = token_nll(model, batch.inputs.to(device), batch.targets.to(device))
        part = perplexity_counts(nll, pred, batch.targets, bins, edges)
        total = part if total is None else total + part
        preds.append(pred.cpu())
        targets.append(batch.targets)
    if total is None:  # open_corpus refuses such a split; a corpus object built by hand may still have one
        raise GradscopeError(f"corpus: {corpus.path}'s {split} split has no paragraph to score")
    return total, torch.cat(preds), torch.cat(targets), bins.sum(1)


def evaluate_lm_checkpoint(loaded: Loaded, opts: AccuracyOptions, device: torch.device) -> AccuracyResult:
    """An :class:`AccuracyResult` of an lm checkpoint on its corpus's test split (``opts.corpus``: the
    corpus's directory if it moved)."""
    task = lm_task(loaded, opts)
    model = loaded.model.to(device)
    counts, preds, targets, types = evaluate_lm(model, task, device)
    model.to("cpu")
    correct, scored = token_correct(preds, targets)
    return AccuracyResult(
        loaded.path, loaded.iteration, loaded.path.parent.name,
        correct.sum(1).numpy(), scored.sum(1).numpy(), sequence_dl_distances(preds, targets).astype(np.float64),
        correct.sum(0).numpy(), scored.sum(0).numpy(), family=counts.arrays(types))


# its store is the token part and its own, with the options attribute of a token store (as the stores written before the families had)
LM = Evaluation(options=option_names(LMOptions), evaluate=evaluate_lm_checkpoint, dataset=tokens_dataset,
                text_probes=TextProbes(label=TEXT, groups=PROBE_GROUPS, task=lm_task, probes=lm_probes,
                                       sequences=lm_sequences, token_classes=lm_token_classes,
                                       trajectories=lm_trajectories, options=(*option_names(LMOptions), "length")))
