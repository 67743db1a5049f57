"""``gradscope accuracy DIR --model hf --text FILE``: perplexity and next-token accuracy of a pretrained
causal LM on raw text, overall, by token frequency and by position in the paragraph, with bootstrap
intervals over paragraphs (docs/real-text.md).

Each paragraph (:mod:`gradscope.workflows.text.tokenize`) is one sequence: the tokenizer's start token (BOS,
else EOS, else none), then the paragraph's tokens; every paragraph token is a target, predicted from
the start token and the tokens before it (without a start token the first token is context only).
A sequence longer than ``max_length`` is scored in overlapping rows
(:func:`gradscope.analysis.text.windows`). Rows, sorted by length, go through the model's own
forward (a library model's, not gradscope's scan) in batches bounded by the logits' memory; only
per-paragraph sums are kept, so memory grows with the paragraph count, not the text.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import xarray as xr
from torch import nn

from gradscope.fields import DEFAULT_DEVICE
from gradscope.workflows.options import DEVICE_LABEL, HF, MAX_TEXT_ROW, TEXT_BATCH, TEXT_MAX_LENGTH, TEXT_RESAMPLES
from gradscope.analysis.perplexity import PerplexityCounts, position_edges
from gradscope.analysis.text import TEXT_FREQ_LABELS, column_sums, ratio_interval, target_nll, text_bins, windows
from gradscope.errors import check
from gradscope.fields import as_int
from gradscope.guard import warn_nonfinite
from gradscope.models.adapters.load import load_hf
from gradscope.models.wrap import WrappedModel
from gradscope.store.accuracy import accuracy_dataset
from gradscope.store.records import AccuracyResult
from gradscope.train.device import resolve_device
from gradscope.fields import MAX_COUNT, as_count
from gradscope.workflows.text.tokenize import TokenizedText, tokenize_text

LOGITS_BUDGET = 1 << 28  # bytes of float32 logits per forward batch (at most; one row always goes)


@dataclass(frozen=True, kw_only=True)
class TextAccuracyOptions:
    """Each field is named as its ``gradscope accuracy`` flag. ``text``: the raw UTF-8 text scored;
    ``counts_text``: the text whose token counts define the frequency bins (None: ``text``);
    ``tokenizer``: the folder of the model's tokenizer (None: the model's directory); ``max_length``:
    tokens per row (start token included; longer paragraphs are windowed); ``batch_size``: rows per
    forward pass (fewer when the logits would exceed 256 MiB); ``resamples``/``seed``: the bootstrap
    over paragraphs; ``cache``: keep the tokenised text beside it."""

    text: str
    counts_text: str | None = None
    tokenizer: str | None = None
    max_length: int = TEXT_MAX_LENGTH
    batch_size: int = TEXT_BATCH
    resamples: int = TEXT_RESAMPLES
    seed: int = 0
    device: str = DEFAULT_DEVICE
    cache: bool = True

    def __post_init__(self) -> None:
        as_int(self.max_length, "max_length", 2, MAX_TEXT_ROW)
        object.__setattr__(self, "batch_size", as_count(self.batch_size, "batch_size", 1, MAX_COUNT))
        as_int(self.resamples, "resamples", 1, 1_000_000)
        as_int(self.seed, "seed", 0, 2**63 - 1)


def _forward(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """ids (B, T) → logits (B, T, V) through the model's own forward."""
    takes_cache = False
    if not isinstance(model, WrappedModel):
        try:
            takes_cache = "use_cache" in inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            pass

    def run(ids: torch.Tensor) -> torch.Tensor:
        out = model(ids, use_cache=False) if takes_cache else model(ids)
        logits = getattr(out, "logits", out)
        check(isinstance(logits, torch.Tensor) and logits.dim() == 3 and logits.shape[:2] == ids.shape,
              f"model: {type(model).__name__} does not give logits (B, T, V) for token ids (B, T); a causal LM "
              f"(e.g. MambaForCausalLM, not MambaModel) is needed")
        return logits

    return run


@dataclass(frozen=True)
class TextAccuracyRun:
    """A finished evaluation; :meth:`to_xarray` gives the accuracy store's dataset."""

    result: AccuracyResult
    options: TextAccuracyOptions
    configs: dict[str, dict[str, Any]]
    intervals: dict[str, tuple[tuple[str, ...], np.ndarray, np.ndarray]]  # name → (dims, low, high)
    text: TokenizedText
    counts_source: str
    paragraphs_scored: int
    command: str = ""
    device: str = DEVICE_LABEL

    def to_xarray(self) -> xr.Dataset:
        opts = self.options
        options = {"text": str(Path(opts.text).resolve()), "counts_text": opts.counts_text and str(Path(opts.counts_text).resolve()),
                   "max_length": opts.max_length, "resamples": opts.resamples, "seed": opts.seed,
                   "start_token": self.text.start, "paragraphs": len(self.text),
                   "paragraphs_scored": self.paragraphs_scored, "tokens": int(self.text.tokens.size)}
        ds = accuracy_dataset([self.result], self.configs, options, self.command, self.device)
        for name, (dims, low, high) in self.intervals.items():
            ds[f"{name}_low"] = (("checkpoint", *dims), low[None])
            ds[f"{name}_high"] = (("checkpoint", *dims), high[None])
        return ds


def _load(model: Any, tokenizer: str | None, model_factory: str) -> tuple[nn.Module, Path, str]:
    """The model, its tokenizer's folder and a label of where it came from."""
    if isinstance(model, (str, Path)):
        folder = Path(model)
        check(folder.is_dir(), f"checkpoint: {folder} is not a directory; --text takes the folder "
                               f"model.save_pretrained and tokenizer.save_pretrained wrote")
        check(model_factory == "hf" or model_factory.startswith("hf:"),
              f"model_factory: got {model_factory!r}; with text, the model is a transformers model: hf or hf:CLASS")
        return load_hf(model_factory, folder), Path(tokenizer) if tokenizer is not None else folder, str(folder)
    check(isinstance(model, nn.Module), f"model: expected a save_pretrained directory or a torch module; got "
                                        f"{type(model).__name__}")
    check(tokenizer is not None, "tokenizer: a model in memory needs the folder of its tokenizer (tokenizer=DIR)")
    return model, Path(tokenizer), "<in memory>"


def _describe(model: nn.Module, vocab: int) -> dict[str, Any]:
    if isinstance(model, WrappedModel):
        return {**model.describe(), "pe": "none", "vocab_size": vocab}
    cfg = getattr(model, "config", None)
    out: dict[str, Any] = {"core": type(model).__name__, "pe": "none",  # gradscope adds no positional encoding
                           "wrapped": f"{type(model).__module__.split('.')[0]}.{type(model).__name__}", "vocab_size": vocab}
    for key in ("hidden_size", "num_hidden_layers", "state_size", "model_type"):
        value = getattr(cfg, key, None)
        if isinstance(value, (int, str)):
            out["num_layers" if key == "num_hidden_layers" else key] = value
    return out


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' notes (e.g. on a slow reference kernel) off stderr: a command's output stays its own."""
    try:
        import transformers
    except ImportError:
        yield
        return
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)


def run_text_accuracy(model: Any, opts: TextAccuracyOptions, *, model_factory: str = HF,
                      on_start: Callable[[int], None] | None = None,
                      on_progress: Callable[[int], None] | None = None, command: str = "") -> TextAccuracyRun:
    """Score ``opts.text`` with ``model`` (a save_pretrained directory, or a causal LM in memory with
    ``opts.tokenizer``); see the module docstring."""
    with _quiet_transformers():
        return _run(model, opts, model_factory, on_start, on_progress, command)


def _run(model: Any, opts: TextAccuracyOptions, model_factory: str, on_start: Callable[[int], None] | None,
         on_progress: Callable[[int], None] | None, command: str) -> TextAccuracyRun:
    net, tok_dir, source = _load(model, opts.tokenizer, model_factory)
    warn_nonfinite(net, f"model: {source}")
    device = resolve_device(opts.device)
    text = tokenize_text(opts.text, tok_dir, what="text", cache=opts.cache)
    counts_text = tokenize_text(opts.counts_text, tok_dir, what="counts_text", cache=opts.cache) \
        if opts.counts_text is not None else None
    net = net.to(device).eval()
    forward = _forward(net)
    start = text.start
    with torch.no_grad():  # the vocabulary from token 0: the start token may lie beyond it (checked next)
        vocab = int(forward(torch.tensor([[0]], device=device)).shape[-1])
    check(start is None or start < vocab, f"tokenizer: its start token {start} is beyond the model's vocabulary of {vocab}")
    counts = (counts_text if counts_text is not None else text).counts(vocab)
    text.counts(vocab)  # every id of the scored text within the model's vocabulary
    bins = text_bins(counts)  # (13, V)
    lengths = text.lengths + (1 if start is not None else 0)  # sequence lengths
    longest = int(text.lengths.max())
    edges = position_edges(max(longest, 1))
    n_par = len(text)
    rows = [(i, a, b, first) for i in np.flatnonzero(lengths >= 2) for a, b, first in windows(int(lengths[i]), opts.max_length)]
    check(bool(rows), f"text: {text.path} has no paragraph of two or more tokens (with the start token), so nothing "
                      f"can be predicted")
    rows.sort(key=lambda r: r[2] - r[1])
    n_freq, n_pos = len(TEXT_FREQ_LABELS), len(edges)
    cols = 1 + n_freq + n_pos
    s_nll, s_n, s_hit = (np.zeros((n_par, cols)) for _ in range(3))
    t_hit, t_n = np.zeros(longest, dtype=np.int64), np.zeros(longest, dtype=np.int64)
    pos_of_col = np.array([a for a, _ in edges]), np.array([b for _, b in edges])
    if on_start is not None:
        on_start(len(rows))
    shift = 0 if start is not None else 1  # paragraph position of sequence index j: j (start token) or j + 1
    k = 0
    while k < len(rows):
        _, a, b, _ = rows[min(len(rows), k + opts.batch_size) - 1]  # rows are sorted: the batch's longest
        fit = max(1, LOGITS_BUDGET // max(1, (b - a) * vocab * 4))
        batch = rows[k:k + min(opts.batch_size, fit)]
        width = max(b - a for _, a, b, _ in batch)
        ids = torch.full((len(batch), width), start if start is not None else 0, dtype=torch.long)
        mask = torch.zeros(len(batch), width - 1, dtype=torch.bool)
        par, pos = np.zeros((len(batch), width - 1), dtype=np.int64), np.zeros((len(batch), width - 1), dtype=np.int64)
        for r, (i, a, b, first) in enumerate(batch):
            seq = text.tokens[text.offsets[i]:text.offsets[i + 1]]
            if start is not None:
                seq = np.concatenate([[start], seq])
            ids[r, :b - a] = torch.from_numpy(np.asarray(seq[a:b], dtype=np.int64))
            mask[r, first - a - 1:b - a - 1] = True
            par[r] = i
            pos[r] = np.arange(a + 1, a + width) + shift
        with torch.no_grad():
            logits = forward(ids.to(device))
        targets = ids[:, 1:]
        nll, pred = target_nll(logits[:, :-1], targets.to(logits.device))
        m = mask.numpy()
        tgt, loss = targets.numpy()[m], nll.numpy()[m]
        hit = (pred.numpy() == targets.numpy())[m].astype(np.float64)
        p, q = par[m], pos[m]
        member = np.concatenate([np.ones((1, tgt.size), dtype=bool), bins[:, tgt],
                                 (q[None] >= pos_of_col[0][:, None]) & (q[None] <= pos_of_col[1][:, None])])
        s_nll += column_sums(p, member, loss, n_par)
        s_n += column_sums(p, member, np.ones_like(loss), n_par)
        s_hit += column_sums(p, member, hit, n_par)
        np.add.at(t_n, q - 1, 1)
        np.add.at(t_hit, q - 1, hit.astype(np.int64))
        k += len(batch)
        if on_progress is not None:
            on_progress(len(batch))
    net.to("cpu")
    tot_nll, tot_n, tot_hit = s_nll.sum(0), s_n.sum(0).astype(np.int64), s_hit.sum(0).astype(np.int64)
    f, g = slice(1, 1 + n_freq), slice(1 + n_freq, cols)
    sums = PerplexityCounts(float(tot_nll[0]), int(tot_n[0]), int(tot_hit[0]), tot_nll[f], tot_n[f], tot_hit[f],
                            tot_nll[g], tot_n[g], tot_hit[g], tuple(edges), TEXT_FREQ_LABELS)
    scored = s_n[:, 0] > 0
    a_nll, a_n, a_hit = s_nll[scored], s_n[scored], s_hit[scored]
    ppl_low, ppl_high = ratio_interval(a_nll, a_n, log_scale=True, resamples=opts.resamples, seed=opts.seed)
    acc_low, acc_high = ratio_interval(a_hit, a_n, log_scale=False, resamples=opts.resamples, seed=opts.seed)
    intervals = {
        "perplexity": ((), ppl_low[0], ppl_high[0]), "token_accuracy": ((), acc_low[0], acc_high[0]),
        "freq_perplexity": (("freq_bin",), ppl_low[f], ppl_high[f]), "freq_accuracy": (("freq_bin",), acc_low[f], acc_high[f]),
        "pos_perplexity": (("pos_bin",), ppl_low[g], ppl_high[g]), "pos_accuracy": (("pos_bin",), acc_low[g], acc_high[g]),
    }
    freq_types = bins.sum(1)
    result = AccuracyResult(Path(source), 0, Path(source).name, s_hit[:, 0].astype(np.int64), s_n[:, 0].astype(np.int64),
                            np.full(n_par, np.nan), t_hit, t_n, family=sums.arrays(freq_types))
    configs = {"model_config": _describe(net, vocab),
               "task_config": {"name": "text", "vocab_size": vocab, "length": opts.max_length,
                               "text": str(text.path.resolve()), "text_sha256": text.sha256,
                               "counts_text": str(counts_text.path.resolve()) if counts_text else None,
                               "counts_sha256": counts_text.sha256 if counts_text else text.sha256,
                               "tokenizer": str(tok_dir.resolve()), "tokenizer_sha256": text.tokenizer_sha256},
               "train_config": {"seed": 0}}
    return TextAccuracyRun(result, opts, configs, intervals, text, "counts_text" if counts_text else "text",
                           int(scored.sum()), command, str(device))
