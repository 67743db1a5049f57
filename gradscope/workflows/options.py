"""The options of `gradscope stability`, `dynamics`, `accuracy` and `summarize`, declared once: each
field made with :func:`gradscope.fields.option` carries its help and is the command's ``--<field>``
flag (the CLI generates the flags from the fields, ``cli/generated.py``); the checks run only in
``__post_init__``; the Python functions take the same names. Torch-free, so that a command's
``--help`` builds its options without loading torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradscope.errors import GradscopeError, check
from gradscope.workflows.families.options import FAMILY_OPTIONS, FamilyOptions
from gradscope.fields import (CHECKPOINT_BUDGET_SECONDS, CHECKPOINTS, CONFIDENCE, DEFAULT_BINS, DEFAULT_DEVICE,
                              DEFAULT_SCORE, ENGINES, EQUIVALENCE_MARGIN, ESTIMATOR, ESTIMATORS, GROUPS, INTERVAL,
                              INTERVALS, JACOBIAN_METHOD, MAX_COUNT, MAX_RESAMPLES, MAX_SEED, PARTS, RESAMPLES,
                              SCALES, SCORE_KINDS, SUMMARY_CHECKPOINTS, as_path, bounded, check_fields, option)

# the dynamics options each part alone reads, and those of the probe sequences (flow, grid, spectra, gates): one
# given while --parts leaves its part out would be recorded in the store and ignored, so it is refused
PART_OPTIONS = {"lyapunov": ("trajectories", "steps", "lyap_warmup", "exponents", "qr_dtype", "reorth"),
                "grid": ("grid_sequences",), "spectra": ("sv",)}
PROBE_PARTS, PROBE_OPTIONS = ("flow", "grid", "spectra", "gates"), ("sequences", "target_freq", "disturbant")


def unread_options(parts: tuple[str, ...] | None, given: set[str], parts_name: str = "parts",
                   ) -> tuple[list[str], str] | None:
    """The options of ``given`` (names) that no part of ``parts`` reads (None: every part, nothing unread), and
    why, the first such part's (``parts_name``: how the caller names the parts option); None when every given
    option is read."""
    chosen = set(PARTS if parts is None else parts)
    for part, names in PART_OPTIONS.items():
        unread = [n for n in names if n in given]
        if part not in chosen and unread:
            return unread, f"they set the {part} part, which {parts_name} leaves out"
    unread = [n for n in PROBE_OPTIONS if n in given]
    if unread and not set(PROBE_PARTS) & chosen:
        return unread, "they set the probe sequences, which only the flow, grid, spectra and gates parts read"
    return None


# the dynamics options that say where the probes come from (a family's own options among them: where its probe
# text lies): a store records the probes themselves instead
PROBE_SOURCE = ("target_freq", "disturbant", "length", "token_counts", "split", *FAMILY_OPTIONS)


def applied_options(opts: "DynamicsOptions") -> dict[str, Any]:
    """What a dynamics store records of ``opts`` (as planned): every option but those of parts it leaves out
    (a part the plan dropped, say, takes its options with it), so nothing that was not applied reaches a store,
    and but the probes' source (:data:`PROBE_SOURCE`), which the store records as the probes."""
    out = {k: v for k, v in dataclasses.asdict(opts).items() if k not in PROBE_SOURCE}
    chosen = set(PARTS if opts.parts is None else opts.parts)
    for part, names in PART_OPTIONS.items():
        if part not in chosen:
            for name in names:
                out.pop(name, None)
    if not set(PROBE_PARTS) & chosen:
        for name in PROBE_OPTIONS:
            out.pop(name, None)
    return out


def derived_warmup(steps: int) -> int:
    """The Lyapunov warm-up a trajectory of ``steps`` steps gets when none is given: a tenth, at most 100."""
    return min(100, steps // 10)


def set_options(opts: "DynamicsOptions") -> set[str]:
    """The dynamics options ``opts`` sets away from their defaults (a warm-up derived from the steps is the
    steps' own, not counted)."""
    changed = {f.name for f in dataclasses.fields(opts) if getattr(opts, f.name) != f.default}
    if opts.steps is not None and opts.lyap_warmup == derived_warmup(opts.steps):
        changed.discard("lyap_warmup")
    return changed - {"parts"}


def check_read(parts: tuple[str, ...] | None, given: set[str]) -> None:
    """Refuse (one line naming them) the options of ``given`` that no part of ``parts`` reads: recorded in the
    store and ignored otherwise."""
    unread = unread_options(parts, given)
    if unread is not None:
        raise GradscopeError(f"{'/'.join(unread[0])}: {unread[1]}; remove {' and '.join(unread[0])}")


QR_DTYPE_NAMES = ("float64", "float32")
# What a dynamics option left out (None) may take, largest first: the plan (workflows.dynamics.plan_dynamics)
# starts at the largest, the defaults before the plan chose, and steps down the biggest part's options until
# the estimate fits the budget. Given explicitly, the same numbers reproduce any earlier store.
LADDERS = {"sequences": (8, 4, 2, 1), "grid_sequences": (4, 2, 1), "trajectories": (8, 4, 2), "steps": (1000, 500, 250, 125)}
DECODING_CHOICES = ("both", "autoregressive", "teacher")  # a feedback model's decodings (paper App. B.2)
TRIPLETS = 64  # stability probe triplets per condition
SPLIT = 0.5  # the share of the token types that occur which are frequent (the rest are rare)
HF = "hf"  # the model factory of a transformers model from its save_pretrained directory
TEXT_MAX_LENGTH = 1024  # tokens per row when a pretrained LM scores a raw text (the paper's language-model rows)
TEXT_RESAMPLES = 1000  # bootstrap resamples over a text's paragraphs
TEXT_BATCH = 16  # rows of a raw text per forward pass
ACCURACY_BATCH = 1024  # held-out sequences of a checkpoint per forward pass
MAX_TEXT_ROW = 1 << 20  # tokens per row of a text: beyond this no model's positions reach
DEVICE_LABEL = "cpu"  # a run's recorded device when none is given
FACTORY_LENGTH = 32  # tokens per probe sequence of a model of one's own, and per row of a text
# the stability probes of a study on text (a corpus's, or a pretrained LM's on a raw text), declared once: paragraph
# token 16 (1-based) of rows of 32 tokens, the start token included
PROBE_TARGET_POS, PROBE_LENGTH = 16, 32
DEFAULT_BUDGET = 60.0  # seconds for the whole dynamics command, all parts and checkpoints (once 600 per part)


# help texts two commands' options share, written once
TARGET_HELP = 'Target token group: {groups} (repeatable). Default: frequent and rare for dual-frequency checkpoints, all otherwise.'
DISTURBANT_HELP = 'Disturbant (prefix and suffix) group: {groups} (repeatable).'
FACTORY_HELP = ("Your own model: FILE.py:FUNC or package.module:FUNC, where FUNC(checkpoint_path) returns gradscope.wrap(...) "
                "(runs your code: see the README's trust note); or hf[:CLASS]: a transformers model from a "
                "save_pretrained directory, or from a weights file with --config (docs/models-from-libraries.md).")
TEXT_HELP = ("With --model hf: a raw UTF-8 text whose paragraphs the probes are drawn from, tokenised with the model's own "
             "tokenizer; tokens are grouped by their frequency in the text (docs/real-text.md).")
COUNTS_TEXT_HELP = "With --text: a (larger) text whose token counts define the frequency groups (default: --text)."
TOKENIZER_HELP = "With --text: the folder of the model's tokenizer (default: the model's directory)."
SOURCES = ("checkpoints", "model", "factory", "text")  # what a command analyses (gradscope.workflows.sources)


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """Where the model comes from, beside the paths a command is given (:func:`gradscope.workflows.sources.source_of`
    resolves them): gradscope checkpoints when every field is left out; else ``model_factory`` builds the model
    from one file or directory, and ``text`` reads it on a raw text. Each field is named as its flag."""

    model_factory: str | None = option(None, FACTORY_HELP, also=("--model",))
    config: Path | None = option(None, "With --model-factory hf:CLASS and a weights file: the model's config.json.")
    text: Path | None = option(None, TEXT_HELP)
    counts_text: Path | None = option(None, COUNTS_TEXT_HELP)
    tokenizer: Path | None = option(None, TOKENIZER_HELP)

    def __post_init__(self) -> None:
        check(self.model_factory is None or isinstance(self.model_factory, str),
              f"model_factory: got {type(self.model_factory).__name__}; expected FILE.py:FUNC, module:FUNC or hf[:CLASS]")
        for name in ("config", "text", "counts_text", "tokenizer"):
            as_path(self, name)


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """How `gradscope train` starts, resumes or extends a run, beside the run's settings (the config sections'
    fields and the cores' own options, generated per call); each field is named as its flag. ``beta1``/``beta2``
    and ``max_length`` are settings of the run under other names (TrainConfig.betas; the task's length), checked
    with the run's configuration."""

    resume: Path | None = option(None, "Continue the run in this directory exactly where its last checkpoint left off.")
    preset: str = option(SCALES[0], "Starting configuration: tiny (≈1 min on 2 CPU cores) or paper "
                                    "(docs/definitions.md §3, for a GPU). The settings that follow override it; each "
                                    "is named as its config field.", choices=SCALES)
    beta1: float | None = option(None, "Adam β1.")
    beta2: float | None = option(None, "Adam β2 (paper 0.999; its reference code 0.98).")
    max_length: int | None = option(None, f"A corpus task: the first N tokens of each paragraph (the same as --length; "
                                          f"default {TEXT_MAX_LENGTH}, as the paper).")
    extend_from: Path | None = option(None, "Vocabulary extension (paper §4.2): a checkpoint or run directory to extend "
                                            "to --vocab-size items; only the new rows train, everything pretrained is "
                                            "frozen.")
    new_item_share: float | None = option(None, "--extend-from: probability that a position holds a new item "
                                                "(default: uniform over all items, as the paper did).")
    stop_after: int | None = option(None, "Stop after this many iterations in this invocation (checkpointed; continue "
                                          "with --resume).", low=1, high=MAX_COUNT)

    def __post_init__(self) -> None:
        for name in ("resume", "extend_from"):
            as_path(self, name)
        check_fields(self)


def as_groups(opts: Any, name: str) -> None:
    """Field ``name`` of the frozen ``opts``: probe groups as a tuple, each once."""
    groups = getattr(opts, name)
    check(isinstance(groups, (tuple, list)) and all(isinstance(g, str) for g in groups),
          f"{name}: got {groups!r}; expected a tuple of groups ({', '.join(GROUPS)})")
    object.__setattr__(opts, name, tuple(dict.fromkeys(groups)))  # a group named twice is one condition


@dataclass(frozen=True, kw_only=True)
class TableOptions:
    """What `gradscope stability` prints (the store holds every score, and no intervals)."""

    score: str = option(DEFAULT_SCORE, "Score shown in the table: {scores} (all are stored).", choices=SCORE_KINDS)
    resamples: int = option(RESAMPLES, "Bootstrap resamples for the CIs.", low=1, high=MAX_RESAMPLES)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class StabilityOptions(FamilyOptions):
    """How to probe; each field is named as its ``gradscope stability`` flag (``target_pos`` is
    ``--target-pos``). Empty group tuples mean: the four {frequent, rare}² conditions for a
    dual-frequency checkpoint, all/all for a uniform one."""

    # target groups
    target_freq: tuple[str, ...] = option((), TARGET_HELP)
    # disturbant groups
    disturbant: tuple[str, ...] = option((), DISTURBANT_HELP)
    # the target position p, 1-based
    target_pos: int = option(1, 'Target position p (1-based) whose state z_p the Jacobian starts from.', low=1, high=MAX_COUNT)
    # per condition
    triplets: int = option(TRIPLETS, 'Probe triplets per condition.', low=1, high=MAX_COUNT)
    # a probes file (.npy, .npz or a stability store)
    probes: Path | None = option(None, "Explicit probes: .npy int64 (n, 3, L), .npz with 'tokens' (+ 'target_group', 'disturbant_group'), or a previous stability store.")
    seed: int = option(0, 'Seed for the probes and the bootstrap.', low=0, high=MAX_SEED)
    method: str = option(JACOBIAN_METHOD, 'Jacobian engine: auto, {engines}.', choices=("auto", *ENGINES))
    # triplets per Jacobian batch
    batch_size: int = option(32, 'Triplets per Jacobian batch (bounds memory).', low=1, high=MAX_COUNT)
    # singular values kept per Jacobian
    sv: int = option(64, 'Singular values kept per Jacobian.', low=1, high=MAX_COUNT)
    device: str = option(DEFAULT_DEVICE, 'auto (cuda when present), cpu, cuda or cuda:N.')
    # a user's own model (``--model-factory``): generated probes need token counts and a length;
    # ``filler`` is the output phase's token (L copies after each probe), None for no output phase
    token_counts: Path | None = option(None, 'With --model-factory: counts per token id (.npy, or one per line) to generate probes; frequent = the most frequent half of the seen tokens.')
    length: int | None = option(None, "With --token-counts: the probe length L. On checkpoints probed on their corpus: the probe rows' length (start token included; default: the run's --max-length). With --text: the row's length, start token included (default 32).", low=1, high=MAX_COUNT)
    filler: int | None = option(None, 'With --model-factory: output phase of L copies of this token id after each probe (default: none).', low=0, high=MAX_COUNT)
    split: float = bounded(SPLIT, low=0, high=1, exclusive="both")
    # exact Jacobians, or a sketch with standard errors: auto is exact wherever it fits
    # checkpoint_budget_seconds (estimated before any work) and memory; sketch_units fixes the sketch's size
    estimator: str = option(ESTIMATOR, 'auto (exact Jacobians wherever they fit --checkpoint-budget-seconds and memory, else a sketch), exact, or sketch (Jacobian-vector products; standard errors stored beside each score).', choices=ESTIMATORS)
    sketch_units: int | None = option(None, 'Independent units of the sketch (default: the most in 4..16 that fit the budget).', low=2, high=1024)
    checkpoint_budget_seconds: float = option(CHECKPOINT_BUDGET_SECONDS, "Time budget of each checkpoint, estimated before any work at a laptop CPU's rate; decides exact or sketch.", low=0, exclusive="low")

    def __post_init__(self) -> None:
        """Paths and groups as given by the CLI (strings, lists) made their types; the ranges are the fields'
        (:func:`~gradscope.fields.check_fields`); then the rules between fields (bounds that need the model, such
        as target_pos <= L, and the memory the probes need are checked once the checkpoint is known)."""
        for name in ("target_freq", "disturbant"):
            as_groups(self, name)
        super().__post_init__()  # the families' own options (FamilyOptions), checked by their families
        for name in ("probes", "token_counts"):
            as_path(self, name)
        check(isinstance(self.device, str), f"device: got {self.device!r}; expected a device name such as cpu")
        check_fields(self)
        check(self.estimator != "exact" or self.sketch_units is None,
              "sketch_units: it sizes a sketch; with estimator 'exact' leave it out")


@dataclass(frozen=True, kw_only=True)
class DynamicsOptions(FamilyOptions):
    """What to compute. ``sequences`` probe sequences per condition; ``steps`` and ``lyap_warmup`` of each of
    ``trajectories`` Lyapunov trajectories, re-orthonormalised every ``reorth`` steps.

    None (the default of parts, sequences, grid_sequences, trajectories, steps, exponents): the plan
    chooses, the most of each (every part; 8, 4, 8, 1000, all D) that fits ``budget_seconds`` for the
    whole command, and says what it chose. Given explicitly, an option is kept as given, and work that
    does not fit the budget is an error naming ``budget_seconds``."""

    parts: tuple[str, ...] | None = option(None, 'Parts: {parts} (comma-separated or repeated; default: every part that fits --budget-seconds; the plan says which).')
    # per condition
    sequences: int | None = option(None, 'Probe sequences per condition (flow, spectra, gates; default: 8, fewer if that does not fit --budget-seconds).', low=1, high=MAX_COUNT)
    grid_sequences: int | None = option(None, 'Sequences for the (t, T) grid (default: 4, fewer if that does not fit).', low=1, high=MAX_COUNT)
    # top singular values kept per step Jacobian
    sv: int = option(8, 'Top singular values kept per step Jacobian.', low=1, high=MAX_COUNT)
    trajectories: int | None = option(None, 'Lyapunov trajectories (default: 8, fewer if that does not fit).', low=1, high=MAX_COUNT)
    steps: int | None = option(None, "Steps per Lyapunov trajectory, the task's episodes back to back (default: 1000, fewer if that does not fit).", low=1, high=MAX_COUNT)
    # None: a tenth of the steps, at most 100
    lyap_warmup: int | None = option(None, 'Warm-up steps discarded from the Lyapunov estimate (default: a tenth of --steps, at most 100).')
    reorth: int = option(1, 'Re-orthonormalise every k steps (product of k step Jacobians first).', low=1, high=MAX_COUNT)
    seed: int = option(0, 'Seed of the probes and trajectories.', low=0, high=MAX_SEED - 1)  # trajectories use seed + 1
    device: str = option(DEFAULT_DEVICE, 'auto (cuda when present), cpu, cuda or cuda:N.')
    # None: all D when they fit the time budget, else the top k that fit
    exponents: int | None = option(None, 'Top k Lyapunov exponents (default: all D when they fit --budget-seconds, else the top k that fit; structured cores: all, exactly).', low=1, high=MAX_COUNT)
    qr_dtype: str = option(QR_DTYPE_NAMES[0], "dtype of J·Q, the QR and the log-sums: float64 or float32 (faster, ~0.1 off in a spectrum's tail).", choices=QR_DTYPE_NAMES)
    # the whole command's estimated wall time (dynamics_cost)
    budget_seconds: float = option(DEFAULT_BUDGET, "Time budget of the whole command (every part and checkpoint), estimated before any work at this machine's measured rates (options left out shrink to fit it) and watched while it runs (parts the plan chose are left out if it would pass 1.2 × the budget).", low=0, exclusive="low")
    # the probes' source: recorded with the probes (their conditions, tokens and classes), not among the options
    target_freq: tuple[str, ...] = option((), "Probe target group(s) of a checkpoint's task: {groups} (repeatable).")
    disturbant: tuple[str, ...] = option((), "Probe disturbant group(s) of a checkpoint's task: {groups} (repeatable).")
    length: int | None = option(None, f"With --model-factory: probe sequence length (default {FACTORY_LENGTH}), tokens uniform over the embedding's vocabulary; with --text: the row length, start token included (default {FACTORY_LENGTH}).", low=1, high=MAX_COUNT)
    token_counts: Path | None = option(None, "With --model-factory: counts per token id (.npy, or one per line): steps are classed frequent/rare by them.")
    split: float = bounded(SPLIT, low=0, high=1, exclusive="both")  # with text: the share of frequent types

    def __post_init__(self) -> None:
        """Types and ranges; the memory and time the sizes imply are checked once the model is known
        (:func:`plan_dynamics`). ``parts`` may be a comma-separated string."""
        if isinstance(self.parts, str):
            object.__setattr__(self, "parts", tuple(p.strip() for p in self.parts.split(",") if p.strip()))
        elif isinstance(self.parts, (tuple, list)) and all(isinstance(p, str) for p in self.parts):  # --parts a,b --parts c
            object.__setattr__(self, "parts", tuple(q.strip() for p in self.parts for q in p.split(",") if q.strip()))
        if self.parts is not None:
            check(isinstance(self.parts, (tuple, list)) and all(isinstance(p, str) for p in self.parts),
                  f"parts: got {self.parts!r}; valid parts are {', '.join(PARTS)}")
            bad = [p for p in self.parts if p not in PARTS]
            check(not bad and bool(self.parts), f"parts: got {', '.join(bad) or 'none'}; valid parts are {', '.join(PARTS)}")
            object.__setattr__(self, "parts", tuple(dict.fromkeys(self.parts)))
        for name in ("target_freq", "disturbant"):
            as_groups(self, name)
        super().__post_init__()  # the families' own options (FamilyOptions), checked by their families
        as_path(self, "token_counts")
        check(isinstance(self.device, str), f"device: got {self.device!r}; expected a device name such as cpu")
        check_fields(self)
        if self.lyap_warmup is None and self.steps is not None:
            object.__setattr__(self, "lyap_warmup", derived_warmup(self.steps))
        if self.lyap_warmup is not None:
            top = self.steps if self.steps is not None else LADDERS["steps"][0]
            check(not isinstance(self.lyap_warmup, bool) and isinstance(self.lyap_warmup, int) and 0 <= self.lyap_warmup < top,
                  f"lyap_warmup: got {self.lyap_warmup!r}; it must be an integer in [0, {top - 1}] (below steps = {top}; "
                  f"leave it out for a tenth of the steps, here {derived_warmup(top)})")

    @property
    def resolved(self) -> bool:
        """Whether every option the plan chooses is set (as :attr:`DynamicsPlan.options` is)."""
        return None not in (self.parts, self.sequences, self.grid_sequences, self.trajectories, self.steps)

    def filled(self) -> "DynamicsOptions":
        """Every option left out set to the largest it may take (the defaults before the plan chose them)."""
        top = {name: ladder[0] for name, ladder in LADDERS.items() if getattr(self, name) is None}
        return dataclasses.replace(self, parts=self.parts or PARTS, **top)


def parse_bins(text: str) -> int | tuple[int, ...]:
    """'4' → 4 equal bins; '0,8,64' → explicit 0-based edges."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise GradscopeError(f"bins: got {text!r}; give a number of bins (4) or edges (0,16,32,64)") from None
    if len(values) == 1:
        if values[0] < 1:
            raise GradscopeError(f"bins: got {values[0]}; need at least 1 bin")
        return values[0]
    if values != sorted(set(values)) or values[0] != 0:
        raise GradscopeError(f"bins: got {text!r}; edges must start at 0 and increase")
    return tuple(values)


@dataclass(frozen=True, kw_only=True)
class AccuracyOptions(FamilyOptions):
    """Each field is named as its ``gradscope accuracy`` flag. ``grid``: None = evaluate the grid when
    the checkpoint has one; True = require it, False = skip it. ``batch_size``: sequences per forward pass.
    ``decoding`` (feedback models, paper App. B.2): both = self-fed (autoregressive, the main
    figures) and ground-truth fed (teacher) side by side, or one of them. ``resamples``: bootstrap
    resamples of the per-position cosine-similarity intervals (vector tasks; None: 10,000), seeded by
    ``seed`` (None: 0). An option given (not None) where it does not apply (resamples or seed on a
    token task, a family's own option (:class:`FamilyOptions`) on a checkpoint of another family) is refused,
    not ignored."""

    # None: 4 (quarters) where there is a grid
    bins: int | tuple[int, ...] | str | None = option(None, 'Target-position bins of the grid: a count or 0-based edges (0,8,64). Default: 4 (quarters; one per position on a shorter grid); refused for a checkpoint without a grid.')
    grid: bool | None = option(None, 'Require (--grid) or skip (--no-grid) the frequency grid. Default: evaluate it when the checkpoint has one.')
    device: str = option(DEFAULT_DEVICE, 'auto (cuda when present), cpu, cuda or cuda:N.')
    # None: ACCURACY_BATCH sequences of a checkpoint's held-out set, TEXT_BATCH rows of a text
    batch_size: int | None = option(None, 'Sequences per forward pass (default 1024; with --text: rows per forward pass, default 16).', low=1, high=MAX_COUNT)
    decoding: str = option(DECODING_CHOICES[0], 'Feedback models (trained with --decoding): both (self-fed and ground-truth fed, side by side), autoregressive or teacher.', choices=DECODING_CHOICES)
    resamples: int | None = option(None, 'Bootstrap resamples: of the per-position cosine-similarity CIs (families with vector outputs; default 10,000), or with --text of the CIs over paragraphs (default 1,000).', low=1, high=MAX_RESAMPLES)
    seed: int | None = option(None, 'Seed of the bootstrap resamples (families with vector outputs, or --text; default 0).', low=0, high=MAX_SEED)
    max_length: int | None = option(None, f"With --text: tokens per row, start token included (default {TEXT_MAX_LENGTH}); longer paragraphs are scored in overlapping windows.", low=2, high=MAX_TEXT_ROW)

    def __post_init__(self) -> None:
        super().__post_init__()  # the families' own options (FamilyOptions), checked by their families
        if isinstance(self.bins, str):  # as the flag gives it: '4' or '0,8,64'
            object.__setattr__(self, "bins", parse_bins(self.bins))
        check_fields(self)

    def bins_for(self, length: int | None) -> int | tuple[int, ...]:
        """The bins of a grid of ``length`` target positions: as given, else quarters (fewer bins when
        the grid has fewer than 4 positions: the default must not fail where the grid is short)."""
        if self.bins is not None:
            return self.bins
        return DEFAULT_BINS if length is None else min(DEFAULT_BINS, length)

    @property
    def batch_used(self) -> int:
        """Sequences of a checkpoint's held-out set per forward pass."""
        return ACCURACY_BATCH if self.batch_size is None else self.batch_size

    @property
    def resamples_used(self) -> int:
        return RESAMPLES if self.resamples is None else self.resamples

    @property
    def seed_used(self) -> int:
        return 0 if self.seed is None else self.seed


SUMMARIZED = ("accuracy", "stability")  # the kinds of store summarize reads
UNITS = ("trial", "token")  # what summarize resamples: seeds, or the pooled tokens/sequences/triplets


@dataclass(frozen=True, kw_only=True)
class SummarizeOptions:
    """How `gradscope summarize` groups and resamples; each field is named as its flag. The ``by`` names
    are resolved against the config fields (and the cores' settings) once the stores are read."""

    kind: str | None = option(None, "With a sweep directory or a folder: summarize only its accuracy or only its "
                                    "stability stores (default: each kind it has).")
    by: str = option("core,pe,vocab_size", "Config fields to group by, named as gradscope train's settings (core, pe, "
                                           "vocab_size, hidden_size, num_layers, embed_size, pe_combine, task, length, "
                                           "rarity, distribution, and the cores' own settings) or by their short names "
                                           "(model, vocab, hidden, layers, embed, combine, state, …; an unknown name "
                                           "lists them all).")
    unit: str = option(UNITS[0], "Resampling unit: trial (seeds, as in the paper) or token (pooled "
                                "tokens/sequences/triplets).", choices=UNITS)
    resamples: int = option(RESAMPLES, "Bootstrap resamples.", low=1, high=MAX_RESAMPLES)
    ci: float = option(CONFIDENCE, "Confidence level.", low=0, high=1, exclusive="both")
    # summary stores record it as their "method" attribute
    interval: str = option(INTERVAL, "Interval: {intervals} (percentile is the paper's; t is Student t, "
                                         "better coverage with few trials).", choices=INTERVALS)
    metric: tuple[str, ...] = option((), "Metrics to show (repeatable; 'all' for every one). Default: the main ones. "
                                         "The store always holds all.")
    score: str = option(DEFAULT_SCORE, "Stability stores: which score to summarize: {scores}.")
    compare: str | None = option(None, "A --by field with two values (e.g. pe): paired permutation test between "
                                       "them, by seed.")
    checkpoints: str = option(SUMMARY_CHECKPOINTS, "Which checkpoints of each store: last, or all (with --compare: the seed-level "
                                      "interval of the difference at every training iteration, and the test of "
                                      "whether it opens from the first to the last; docs/cli.md).", choices=CHECKPOINTS)
    margin: float = option(EQUIVALENCE_MARGIN, "With --checkpoints all and --compare: the equivalence margin of the test's 'no "
                                 "effect' (both t-intervals inside ±margin).", low=0)
    seed: int = option(0, "Seed of the bootstrap and permutation resampling.", low=0, high=MAX_SEED)

    def __post_init__(self) -> None:
        check(self.kind is None or self.kind in SUMMARIZED,
              f"kind: got {self.kind!r}; valid kinds are {', '.join(SUMMARIZED)}")
        if isinstance(self.by, (tuple, list)):
            object.__setattr__(self, "by", ",".join(self.by))
        check(isinstance(self.by, str), f"by: got {type(self.by).__name__}; expected field names (core,pe)")
        items = [v.strip() for v in self.by.split(",")]
        check(all(items), f"by: got {self.by!r}, an empty list or an empty item; give comma-separated fields such "
                          f"as core,pe (an empty one would pool every configuration into one group)")
        check(isinstance(self.metric, (tuple, list)) and all(isinstance(m, str) for m in self.metric),
              f"metric: got {self.metric!r}; expected metric names")
        object.__setattr__(self, "metric", tuple(self.metric))
        check(isinstance(self.score, str), f"score: got {self.score!r}; expected default, frobenius or l1")
        check_fields(self)
