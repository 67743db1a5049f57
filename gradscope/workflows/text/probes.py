"""``gradscope stability|dynamics DIR --model hf --text FILE``: gradient stability and dynamics of a
pretrained LM on probes drawn from raw text (docs/real-text.md).

The text is tokenised (and cached) as for ``accuracy --text`` (:mod:`gradscope.workflows.text.tokenize`). A
probe row is the model's own input row for a paragraph: the tokenizer's start token (if it has one),
then the paragraph's first tokens, ``length`` in all; ``target_pos`` p counts paragraph tokens.
Frequency groups are :func:`~gradscope.tasks.probes.frequency_groups` of the counts of the text (or of
``counts_text``): ``frequent`` the most frequent ``split`` of the types that occur, ``rare`` the rest,
``all`` every type that occurs; a type absent from the counts text is in none of them.

Stability (docs/definitions.md §4's triplets, built as :func:`gradscope.workflows.families.lm.lm_probes` builds them on a
corpus). For a condition (target group t, disturbant group d), a paragraph is a candidate when it has
a row's worth of tokens, its token at p is of group t, and its prefix (tokens 1 … p − 1) and its suffix
(tokens p + 1 … of the row) are each of group d: ``all`` takes any text, ``frequent``/``rare`` a span at
least :data:`DISTURBANT_SHARE` of whose tokens are of the group (an empty span is of every group).
Per triplet, with ``numpy.random.default_rng(seed)``:

- base (P, x, S): a candidate paragraph A;
- same-target (P, x, S′): A's row up to and including the target, then the suffix of another candidate
  C (one whose suffix differs from A's where there is one): real text of group d after a group-t token;
- same-suffix (P′, x′, S): the prefix and target of another candidate B whose target differs from x
  (where there is one), then A's suffix.

There is no output phase: the Jacobian runs from the state after the target to the last step of the
row, as on checkpoints probed on their corpus. Dynamics: probe sequences are the rows of paragraphs drawn without
replacement (with, when fewer exist), each step classed by its token (``frequent``, ``rare``,
``unseen`` or ``start``); the Lyapunov trajectories are consecutive paragraphs' rows back to back from
a random paragraph, wrapping round the text.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from gradscope.workflows.options import HF
from gradscope.errors import check
from gradscope.guard import check_bytes, warn_nonfinite
from gradscope.models.adapters import adapter_for
from gradscope.models.adapters.load import load_hf
from gradscope.models.wrap import WrappedModel, fit_positions, wrap
from gradscope.tasks.probes import GROUPS, Probes, frequency_groups
from gradscope.fields import MAX_COUNT, as_count
from gradscope.workflows.dynamics import (DynamicsOptions, DynamicsPlan, DynamicsRun, defined_parts, plan_core,
                                         run_model_dynamics)
from gradscope.workflows.sources import TextSource
from gradscope.workflows.options import PROBE_LENGTH
from gradscope.workflows.stability import StabilityOptions, StabilityRun, result_bytes, run_model_stability
from gradscope.workflows.text.tokenize import TokenizedText, tokenize_text
from gradscope.workflows.text.accuracy import _quiet_transformers

DISTURBANT_SHARE = 0.5  # a frequent/rare disturbant span: at least this share of its tokens in the group
DEFAULT_LENGTH = PROBE_LENGTH  # tokens per probe row, the start token included
TARGET_GROUPS = ("frequent", "rare")  # the default targets
DISTURBANT_GROUPS = ("all",)  # the default disturbants: the text as it is


@dataclass(frozen=True)
class TextData:
    """The tokenised text, the counts that define the groups, and each group's ids as a mask."""

    text: TokenizedText
    counts: np.ndarray  # (V,) int64
    groups: dict[str, np.ndarray]  # group → (V,) bool
    counts_text: TokenizedText | None

    @property
    def shift(self) -> int:
        """Columns before paragraph token 1 in a row: 1 with a start token, else 0."""
        return int(self.text.start is not None)

    def task_config(self, tokenizer: Path, split: float) -> dict[str, Any]:
        text, counts = self.text, self.counts_text
        return {"name": "text", "text": str(text.path.resolve()), "text_sha256": text.sha256,
                "counts_text": str(counts.path.resolve()) if counts else None,
                "counts_sha256": counts.sha256 if counts else text.sha256,
                "tokenizer": str(tokenizer.resolve()), "tokenizer_sha256": text.tokenizer_sha256,
                "start_token": text.start, "split": split, "disturbant_share": DISTURBANT_SHARE,
                "vocab_size": int(self.counts.size)}


def text_model(model: Any, tokenizer: str | Path | None, model_factory: str = HF,
               config: str | Path | None = None) -> tuple[WrappedModel, Path, str]:
    """The wrapped model, its tokenizer's folder and a label: from a ``save_pretrained`` directory
    (``model_factory`` hf or hf:CLASS; its tokenizer in it unless ``tokenizer`` says where), or a
    model in memory (a wrapped model or a library model gradscope adapts) with ``tokenizer``."""
    if isinstance(model, (str, Path)):
        where = Path(model)
        check(where.exists(), f"checkpoint: {where} does not exist")
        check(model_factory == "hf" or model_factory.startswith("hf:"),
              f"model_factory: got {model_factory!r}; with text, the model is a transformers model with its own "
              f"tokenizer: hf or hf:CLASS")
        check(where.is_dir() or tokenizer is not None,
              f"tokenizer: {where} is a weights file; give the folder of the model's tokenizer (--tokenizer DIR)")
        net = wrap(load_hf(model_factory, where, None if config is None else Path(config)))
        return net, Path(tokenizer) if tokenizer is not None else where, str(where)
    check(tokenizer is not None, "tokenizer: a model in memory needs the folder of its tokenizer (tokenizer=DIR)")
    if not isinstance(model, WrappedModel):
        check(isinstance(model, nn.Module) and adapter_for(model) is not None,
              f"model: expected a save_pretrained directory, gradscope.wrap(...) or a library model gradscope "
              f"adapts; got {type(model).__name__}")
        model = wrap(model.eval())
    return model, Path(tokenizer), "<in memory>"


def read_text(model: WrappedModel, source: TextSource, tokenizer: Path, split: float) -> TextData:
    """The text and the counts text tokenised, every id inside the model's vocabulary, the groups."""
    vocab = getattr(getattr(model, "inputs", None), "num_embeddings", None)
    check(vocab is not None, "model: it has no token embedding (nn.Embedding); text probes are token ids")
    text = tokenize_text(source.text, tokenizer, what="text", cache=source.cache)
    counts_text = tokenize_text(source.counts_text, tokenizer, what="counts_text", cache=source.cache) \
        if source.counts_text is not None else None
    text.counts(int(vocab))  # every id of the probed text inside the vocabulary
    counts = (counts_text or text).counts(int(vocab))
    check(text.start is None or text.start < vocab,
          f"tokenizer: its start token {text.start} is beyond the model's vocabulary of {vocab}")
    ids = frequency_groups(torch.from_numpy(counts), split)
    groups = {}
    for name, members in ids.items():
        mask = np.zeros(counts.size, dtype=bool)
        mask[members.numpy()] = True
        groups[name] = mask
    return TextData(text, counts, groups, counts_text)


def paragraph_rows(data: TextData, length: int) -> np.ndarray:
    """(m, length) int64 probe rows of every paragraph long enough for one (module docstring)."""
    text, shift = data.text, data.shift
    need = length - shift
    long_enough = np.flatnonzero(text.lengths >= need)
    check(long_enough.size >= 1, f"length: got {length}; no paragraph of {text.path} has the {need} tokens a row of "
                                 f"{length} needs (its longest has {int(text.lengths.max())}); give a smaller length")
    rows = np.empty((long_enough.size, length), dtype=np.int64)
    if shift:
        rows[:, 0] = text.start
    starts = text.offsets[long_enough]
    rows[:, shift:] = text.tokens[starts[:, None] + np.arange(need)[None]]
    return rows


def _of_group(span: np.ndarray, group: str, masks: dict[str, np.ndarray]) -> np.ndarray:
    """(m,) bool: whether each row of ``span`` (m, k) is of disturbant ``group``."""
    if group == "all" or span.shape[1] == 0:
        return np.ones(span.shape[0], dtype=bool)
    return masks[group][span].mean(1) >= DISTURBANT_SHARE


def text_probes(data: TextData, *, triplets: int, target_pos: int, length: int, target_freq: tuple[str, ...] = (),
                disturbant: tuple[str, ...] = (), seed: int = 0) -> Probes:
    """``triplets`` probe triplets per (target group, disturbant group) condition drawn from the text
    with ``numpy.random.default_rng(seed)`` (module docstring). Defaults: targets frequent and rare,
    disturbants all (the text as it is)."""
    for name, chosen in (("target_freq", target_freq), ("disturbant", disturbant)):
        bad = [g for g in chosen if g not in GROUPS]
        check(not bad, f"{name}: got {bad[0] if bad else ''!r}; valid values are {', '.join(GROUPS)}")
    shift = data.shift
    check(1 <= target_pos <= length - shift - 1,  # a suffix of one token at least: S′ differs from S
          f"target_pos: got {target_pos}; valid positions are 1…{length - shift - 1} (paragraph tokens of a probe "
          f"row of length {length}{', the start token first' if shift else ''}, before its last)")
    rows = paragraph_rows(data, length)
    col = target_pos - 1 + shift
    target, prefix, suffix = rows[:, col], rows[:, shift:col], rows[:, col + 1:]
    rng = np.random.default_rng(seed)
    out, labels = [], []
    for t, d in itertools.product(target_freq or TARGET_GROUPS, disturbant or DISTURBANT_GROUPS):
        has_target = data.groups[t][target]
        eligible = np.flatnonzero(has_target & _of_group(prefix, d, data.groups) & _of_group(suffix, d, data.groups))
        check(eligible.size >= 2,
              f"target_freq/disturbant: {data.text.path} supplies {eligible.size} candidate paragraph(s) for target "
              f"{t} with disturbant {d} ({rows.shape[0]} paragraph(s) of at least {length - shift} tokens, "
              f"{int(has_target.sum())} of them with a {t} token at position {target_pos}"
              + ("" if d == "all" else f", of which {eligible.size} have a prefix and a suffix at least "
                                       f"{DISTURBANT_SHARE:g} {d}") +
              "); need 2 (a longer text, a shorter length, another target_pos or group, or counts_text)")
        a = rng.choice(eligible, triplets)
        c = np.empty_like(a)
        b = np.empty_like(a)
        for k, i in enumerate(a):
            others = eligible[eligible != i]
            differ = others[(suffix[others] != suffix[i]).any(1)] if suffix.shape[1] else others
            c[k] = rng.choice(differ if differ.size else others)
            differ = others[target[others] != target[i]]
            b[k] = rng.choice(differ if differ.size else others)
        base = rows[a]
        same_target = base.copy()
        same_target[:, col + 1:] = rows[c, col + 1:]
        same_suffix = base.copy()
        same_suffix[:, :col + 1] = rows[b, :col + 1]
        out.append(np.stack([base, same_target, same_suffix], axis=1))
        labels += [(t, d)] * triplets
    return Probes(torch.from_numpy(np.concatenate(out)), tuple(t for t, _ in labels), tuple(d for _, d in labels))


def text_token_classes(tokens: np.ndarray, data: TextData) -> np.ndarray:
    """(n, T) object: ``frequent``, ``rare`` or ``unseen`` (absent from the counts text) per token, and
    ``start`` in a row's first column when the tokenizer has a start token."""
    out = np.full(tokens.shape, "unseen", dtype=object)
    out[data.groups["rare"][tokens]] = "rare"
    out[data.groups["frequent"][tokens]] = "frequent"
    if data.shift:
        out[:, 0] = "start"
    return out


def text_sequences(data: TextData, n: int, length: int, seed: int) -> np.ndarray:
    """(n, length) probe rows of paragraphs drawn by ``default_rng(seed)`` without replacement (with, when
    fewer are long enough)."""
    rows = paragraph_rows(data, length)
    pick = np.random.default_rng(seed).choice(rows.shape[0], n, replace=rows.shape[0] < n)
    return rows[pick]


def text_trajectories(data: TextData, n: int, steps: int, seed: int) -> np.ndarray:
    """(n, steps) token ids: consecutive paragraphs (each its start token, if any, then its tokens) back
    to back from a paragraph drawn by ``default_rng(seed)``, wrapping round the text."""
    text = data.text
    check_bytes(8 * n * steps, "trajectories × steps token ids")
    rng = np.random.default_rng(seed)
    out = np.empty((n, steps), dtype=np.int64)
    for r, first in enumerate(rng.integers(0, len(text), n)):
        have, i = 0, int(first)
        while have < steps:
            j = i % len(text)
            part = text.tokens[text.offsets[j]:text.offsets[j + 1]]
            if data.shift:
                part = np.concatenate([[text.start], part])
            take = min(part.size, steps - have)
            out[r, have:have + take] = part[:take]
            have += take
            i += 1
    return out


def _config(model: WrappedModel, data: TextData, tokenizer: Path, split: float, length: int) -> dict[str, Any]:
    return {"model_config": {**model.describe(), "pe": "none", "vocab_size": int(data.counts.size)},
            "task_config": {**data.task_config(tokenizer, split), "length": length}, "train_config": {"seed": 0}}


def run_text_stability(model: Any, opts: StabilityOptions, source: TextSource, *, model_factory: str = HF,
                       config: str | Path | None = None, command: str = "",
                       on_start: Callable[[int], None] | None = None,
                       on_progress: Callable[[int], None] | None = None,
                       on_plan: Callable[[Any], None] | None = None) -> StabilityRun:
    """Stability (docs/definitions.md §4) of ``model`` (see :func:`text_model`) on triplets drawn from ``source.text``
    (:func:`text_probes`; ``opts.length`` tokens per row, default :data:`DEFAULT_LENGTH`). The options a text does
    not read (probes, token_counts, filler, corpus) are refused before, by :func:`gradscope.workflows.sources.check_reads`."""
    length = opts.length if opts.length is not None else DEFAULT_LENGTH
    check(length >= 2, f"length: got {length}; a text probe row needs at least 2 tokens")
    with _quiet_transformers():
        net, tok_dir, label = text_model(model, source.tokenizer, model_factory, config)
        warn_nonfinite(net, f"model: {label}")
        data = read_text(net, source, tok_dir, opts.split)
        groups = len(opts.target_freq or TARGET_GROUPS) * len(opts.disturbant or DISTURBANT_GROUPS)
        kept = min(opts.sv, net.core.out_dim, net.core.state_dim)
        check_bytes(result_bytes(groups * opts.triplets, length, 1, kept), "triplets")
        probes = text_probes(data, triplets=opts.triplets, target_pos=opts.target_pos, length=length,
                             target_freq=opts.target_freq, disturbant=opts.disturbant, seed=opts.seed)
        return run_model_stability(net, dataclasses.replace(opts, length=length), probes=probes,
                                   position=opts.target_pos + data.shift,
                                   source=Path(label) if label != "<in memory>" else None, command=command,
                                   config=_config(net, data, tok_dir, opts.split, length), on_start=on_start,
                                   on_progress=on_progress, on_plan=on_plan)


def run_text_dynamics(model: Any, opts: DynamicsOptions, source: TextSource, *, model_factory: str = HF,
                      config: str | Path | None = None, command: str = "",
                      on_plan: Callable[[DynamicsPlan], None] | None = None) -> DynamicsRun:
    """Dynamics (docs/definitions.md §7) of ``model`` (see :func:`text_model`) on rows of ``source.text``'s paragraphs
    (:func:`text_sequences`; ``opts.length`` tokens per row, default :data:`DEFAULT_LENGTH`), steps classed by
    frequency group (``opts.split``), Lyapunov trajectories of consecutive paragraphs (:func:`text_trajectories`).
    Options left out are chosen by the plan, as for a checkpoint."""
    length = as_count(DEFAULT_LENGTH if opts.length is None else opts.length, "length", 2, MAX_COUNT)
    split = opts.split
    with _quiet_transformers():
        net, tok_dir, label = text_model(model, source.tokenizer, model_factory, config)
        warn_nonfinite(net, f"model: {label}")
        data = read_text(net, source, tok_dir, split)
        net = fit_positions(net, length)  # attention caches: the rows' slots
        opts = defined_parts(net.core, opts)  # a transformer: the flow and grid only
        width = net.core_inputs(torch.zeros(1, 1, dtype=torch.long)).shape[-1]
        plan = plan_core(net.core, opts, 0, length, width=width, conditions=1)
        chosen = plan.options
        if on_plan is not None:
            on_plan(plan)
        tokens = torch.from_numpy(text_sequences(data, chosen.sequences, length, opts.seed))
        traj = None
        if "lyapunov" in chosen.parts:
            traj = torch.from_numpy(text_trajectories(data, chosen.trajectories, chosen.steps, opts.seed + 1))
        fixed = dataclasses.replace(opts, parts=chosen.parts, sequences=chosen.sequences)
        run = run_model_dynamics(net, tokens, fixed, trajectory_tokens=traj, command=command)
    result = run.results[0]
    if label != "<in memory>":
        result = dataclasses.replace(result, path=Path(label), run=Path(label).name)
    probes = Probes(run.probes.tokens, ("text",) * len(tokens), ("text",) * len(tokens))
    return dataclasses.replace(run, results=[result], probes=probes, token_class=text_token_classes(tokens.numpy(), data),
                               config=_config(net, data, tok_dir, split, length))
