"""The options of `gradscope stability`, `dynamics`, `accuracy` and `summarize`, declared once (issue #39): each
field made with :func:`gradscope.fields.option` carries its help and is the command's ``--<field>``
flag (the CLI generates the flags from the fields, ``cli/generated.py``); the checks run only in
``__post_init__``; the Python functions take the same names. Torch-free, so that a command's
``--help`` builds its options without loading torch."""

from __future__ import annotations

import dataclasses
import math
import sys
import warnings
from dataclasses import InitVar, dataclass
from pathlib import Path
from typing import Any

from gradscope.errors import GradscopeError, check
from gradscope.fields import (CHECKPOINTS, DEFAULT_BINS, ENGINES, ESTIMATORS, GROUPS, INTERVALS, MAX_COUNT, PARTS,
                              MAX_RESAMPLES, MAX_SEED, as_count, as_int, as_seed, check_seconds, one_of, option)

# Names the stability options had before issue #24 gave them their flags' names; accepted, with a DeprecationWarning.
RENAMED_OPTIONS = {"target_groups": "target_freq", "disturbant_groups": "disturbant", "position": "target_pos",
                   "probes_file": "probes", "chunk": "batch_size", "top_sv": "sv",
                   # before issue #39: dynamics' --budget-seconds is the whole command's, stability's was per checkpoint
                   "budget_seconds": "checkpoint_budget_seconds"}
# and the dynamics options' (top_sv before issue #24; warmup before #39: train's --warmup is the learning-rate warm-up)
RENAMED_DYNAMICS = {"top_sv": "sv", "warmup": "lyap_warmup"}

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


def applied_options(opts: "DynamicsOptions") -> dict[str, Any]:
    """What a dynamics store records of ``opts`` (as planned): every option but those of parts it leaves out
    (a part the plan dropped, say, takes its options with it), so nothing that was not applied reaches a store."""
    out = dataclasses.asdict(opts)
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
# starts at the largest, the defaults before issue #37, and steps down the biggest part's options until
# the estimate fits the budget. Given explicitly, the same numbers reproduce any earlier store.
LADDERS = {"sequences": (8, 4, 2, 1), "grid_sequences": (4, 2, 1), "trajectories": (8, 4, 2), "steps": (1000, 500, 250, 125)}
DECODING_CHOICES = ("both", "autoregressive", "teacher")  # a feedback model's decodings (paper App. B.2)
DEFAULT_BUDGET = 60.0  # seconds for the whole dynamics command, all parts and checkpoints (600 per part before #37)


_LIBRARY = str(Path(__file__).resolve().parents[1])  # gradscope's own files


def deprecated(message: str) -> None:
    """A DeprecationWarning attributed to the first caller outside gradscope (and outside the code dataclasses
    generate, and dataclasses.replace): Python's default filters show it only there, in a user's own code."""
    frame, level = sys._getframe(0), 1
    while frame is not None and (frame.f_code.co_filename.startswith(_LIBRARY) or frame.f_code.co_filename in
                                 ("<string>", dataclasses.__file__)):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, DeprecationWarning, stacklevel=level)


def renamed_field(obj: Any, old: str, value: Any, new: str) -> None:
    """An options dataclass's old keyword ``old`` (an InitVar; None: not given): its value goes to the field
    ``new``, with a DeprecationWarning for the code that built the dataclass. Given with ``new`` set to another
    value than its default, one error (a dataclass cannot tell its default given from its default left out)."""
    if value is None:
        return
    current, default = getattr(obj, new), obj.__dataclass_fields__[new].default
    _renamed(type(obj).__name__, old, new, clash=current not in (default, value))
    object.__setattr__(obj, new, value)


def take_renamed(options: dict[str, Any], renames: dict[str, str], where: str,
                 defaults: dict[str, Any] | None = None) -> None:
    """A public function's old keywords: each ``renames`` key given in ``options`` (its keywords; with
    ``defaults``, its named parameters and their defaults) moves to its new name, with a DeprecationWarning
    for the function's caller (``where``: the function's name); given with its new name too, one error."""
    for old, new in renames.items():
        value = options.pop(old, None)
        if value is None:
            continue
        given = options.get(new) is not None if defaults is None else options.get(new) != defaults.get(new)
        _renamed(where, old, new, clash=given and options[new] != value)
        options[new] = value


def _renamed(where: str, old: str, new: str, *, clash: bool) -> None:
    """An old name used in ``where``: one error when ``clash`` (its new name set to another value), else the
    DeprecationWarning."""
    check(not clash, f"{new}: given twice, also as {old} (its old name); give {new} only")
    deprecated(f"{where}({old}=…) is now {new}=…, as its flag --{new.replace('_', '-')}")


@dataclass(frozen=True, kw_only=True)
class StabilityOptions:
    """How to probe; each field is named as its ``gradscope stability`` flag (``target_pos`` is
    ``--target-pos``). Empty group tuples mean: the four {frequent, rare}² conditions for a
    dual-frequency checkpoint, all/all for a uniform one."""

    # target groups
    target_freq: tuple[str, ...] = option((), 'Target token group: {groups} (repeatable). Default: frequent and rare for dual-frequency checkpoints, all otherwise.')
    # disturbant groups
    disturbant: tuple[str, ...] = option((), 'Disturbant (prefix and suffix) group: {groups} (repeatable).')
    # the target position p, 1-based
    target_pos: int = option(1, 'Target position p (1-based) whose state z_p the Jacobian starts from.')
    # per condition
    triplets: int = option(64, 'Probe triplets per condition.')
    # a probes file (.npy, .npz or a stability store)
    probes: Path | None = option(None, "Explicit probes: .npy int64 (n, 3, L), .npz with 'tokens' (+ 'target_group', 'disturbant_group'), or a previous stability store.")
    seed: int = option(0, 'Seed for the probes and the bootstrap.')
    method: str = option("auto", 'Jacobian engine: auto, {engines}.')
    # triplets per Jacobian batch
    batch_size: int = option(32, 'Triplets per Jacobian batch (bounds memory).')
    # singular values kept per Jacobian
    sv: int = option(64, 'Singular values kept per Jacobian.')
    device: str = option("auto", 'auto (cuda when present), cpu, cuda or cuda:N.')
    # a user's own model (``--model-factory``): generated probes need token counts and a length;
    # ``filler`` is the output phase's token (L copies after each probe), None for no output phase
    token_counts: Path | None = option(None, 'With --model-factory: counts per token id (.npy, or one per line) to generate probes; frequent = the most frequent half of the seen tokens.')
    length: int | None = option(None, "With --token-counts: the probe length L. On lm checkpoints: the probe rows' length (start token included; default: the run's --max-length).")
    filler: int | None = option(None, 'With --model-factory: output phase of L copies of this token id after each probe (default: none).')
    split: float = 0.5
    # lm checkpoints: this corpus directory instead of the recorded one (it moved)
    corpus: Path | None = option(None, "lm checkpoints: the corpus directory, if it moved since training (its manifest must match the run's).")
    # exact Jacobians, or a sketch with standard errors (issue #37): auto is exact wherever it fits
    # checkpoint_budget_seconds (estimated before any work) and memory; sketch_units fixes the sketch's size
    estimator: str = option("auto", 'auto (exact Jacobians wherever they fit --checkpoint-budget-seconds and memory, else a sketch), exact, or sketch (Jacobian-vector products; standard errors stored beside each score).')
    sketch_units: int | None = option(None, 'Independent units of the sketch (default: the most in 4..16 that fit the budget).')
    checkpoint_budget_seconds: float = option(600.0, "Time budget of each checkpoint, estimated before any work at a laptop CPU's rate; decides exact or sketch.")
    # the old names (RENAMED_OPTIONS), constructor keywords only: read the new names (opts.position is None)
    target_groups: InitVar[tuple[str, ...] | None] = None
    disturbant_groups: InitVar[tuple[str, ...] | None] = None
    position: InitVar[int | None] = None
    probes_file: InitVar[Path | None] = None
    chunk: InitVar[int | None] = None
    top_sv: InitVar[int | None] = None
    budget_seconds: InitVar[float | None] = None

    def __post_init__(self, target_groups: Any, disturbant_groups: Any, position: Any, probes_file: Any, chunk: Any,
                      top_sv: Any, budget_seconds: Any) -> None:
        """Types and ranges (bounds that need the model, such as target_pos <= L, and the memory the
        probes need are checked once the checkpoint is known)."""
        old = dict(zip(RENAMED_OPTIONS, (target_groups, disturbant_groups, position, probes_file, chunk, top_sv,
                                         budget_seconds)))
        for name, value in old.items():
            renamed_field(self, name, value, RENAMED_OPTIONS[name])
        for name in ("target_freq", "disturbant"):
            groups = getattr(self, name)
            check(isinstance(groups, (tuple, list)) and all(isinstance(g, str) for g in groups),
                  f"{name}: got {groups!r}; expected a tuple of groups ({', '.join(GROUPS)})")
            object.__setattr__(self, name, tuple(dict.fromkeys(groups)))  # a group named twice is one condition
        for name in ("target_pos", "triplets", "batch_size", "sv"):
            object.__setattr__(self, name, as_count(getattr(self, name), name, 1, MAX_COUNT))
        object.__setattr__(self, "seed", as_seed(self.seed))
        check(self.method == "auto" or self.method in ENGINES,
              f"method: got {self.method!r}; valid values are auto, {', '.join(ENGINES)}")
        check(isinstance(self.device, str), f"device: got {self.device!r}; expected a device name such as cpu")
        for name in ("probes", "token_counts"):
            value = getattr(self, name)
            check(value is None or isinstance(value, (str, Path)), f"{name}: got {type(value).__name__}; expected a path")
            if isinstance(value, str):
                object.__setattr__(self, name, Path(value))
        if self.length is not None:
            object.__setattr__(self, "length", as_count(self.length, "length", 1, MAX_COUNT))
        if self.filler is not None:
            object.__setattr__(self, "filler", as_count(self.filler, "filler", 0, MAX_COUNT))
        check(isinstance(self.split, (int, float)) and not isinstance(self.split, bool) and 0 < self.split < 1,
              f"split: got {self.split!r}; it must lie strictly between 0 and 1")
        check(self.estimator in ESTIMATORS, f"estimator: got {self.estimator!r}; valid values are {', '.join(ESTIMATORS)}")
        if self.sketch_units is not None:
            object.__setattr__(self, "sketch_units", as_count(self.sketch_units, "sketch_units", 2, 1024))
        check(self.estimator != "exact" or self.sketch_units is None,
              "sketch_units: it sizes a sketch; with estimator 'exact' leave it out")
        check_seconds(self.checkpoint_budget_seconds, "checkpoint_budget_seconds")


@dataclass(frozen=True, kw_only=True)
class DynamicsOptions:
    """What to compute. ``sequences`` probe sequences per condition; ``steps`` and ``lyap_warmup`` of each of
    ``trajectories`` Lyapunov trajectories, re-orthonormalised every ``reorth`` steps.

    None (the default of parts, sequences, grid_sequences, trajectories, steps, exponents): the plan
    chooses, the most of each (every part; 8, 4, 8, 1000, all D) that fits ``budget_seconds`` for the
    whole command, and says what it chose. Given explicitly, an option is kept as given, and work that
    does not fit the budget is an error naming ``budget_seconds``."""

    parts: tuple[str, ...] | None = option(None, 'Parts: {parts} (comma-separated or repeated; default: every part that fits --budget-seconds; the plan says which).')
    # per condition
    sequences: int | None = option(None, 'Probe sequences per condition (flow, spectra, gates; default: 8, fewer if that does not fit --budget-seconds).')
    grid_sequences: int | None = option(None, 'Sequences for the (t, T) grid (default: 4, fewer if that does not fit).')
    # top singular values kept per step Jacobian
    sv: int = option(8, 'Top singular values kept per step Jacobian.')
    trajectories: int | None = option(None, 'Lyapunov trajectories (default: 8, fewer if that does not fit).')
    steps: int | None = option(None, "Steps per Lyapunov trajectory, the task's episodes back to back (default: 1000, fewer if that does not fit).")
    # None: a tenth of the steps, at most 100
    # its name before issue #39 was warmup, which is train's learning-rate warm-up (the old name is a hidden flag
    # and a keyword, both warning)
    lyap_warmup: int | None = option(None, 'Warm-up steps discarded from the Lyapunov estimate (default: a tenth of --steps, at most 100).')
    reorth: int = option(1, 'Re-orthonormalise every k steps (product of k step Jacobians first).')
    seed: int = option(0, 'Seed of the probes and trajectories.')
    device: str = option("auto", 'auto (cuda when present), cpu, cuda or cuda:N.')
    # None: all D when they fit the time budget, else the top k that fit
    exponents: int | None = option(None, 'Top k Lyapunov exponents (default: all D when they fit --budget-seconds, else the top k that fit; structured cores: all, exactly).')
    qr_dtype: str = option("float64", "dtype of J·Q, the QR and the log-sums: float64 or float32 (faster, ~0.1 off in a spectrum's tail).")
    # the whole command's estimated wall time (dynamics_cost)
    budget_seconds: float = option(DEFAULT_BUDGET, "Time budget of the whole command (every part and checkpoint), estimated before any work at this machine's measured rates (options left out shrink to fit it) and watched while it runs (parts the plan chose are left out if it would pass 1.2 × the budget).")
    top_sv: InitVar[int | None] = None  # sv's name before issue #24 (a keyword only; read sv)
    warmup: InitVar[int | None] = None  # lyap_warmup's name before issue #39 (a keyword only; read lyap_warmup)

    def __post_init__(self, top_sv: int | None, warmup: int | None) -> None:
        """Types and ranges; the memory and time the sizes imply are checked once the model is known
        (:func:`plan_dynamics`). ``parts`` may be a comma-separated string."""
        renamed_field(self, "top_sv", top_sv, "sv")
        renamed_field(self, "warmup", warmup, "lyap_warmup")  # train's --warmup is the learning-rate warm-up
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
        for name in ("sequences", "grid_sequences", "sv", "trajectories", "steps", "reorth"):
            if getattr(self, name) is not None or name in ("sv", "reorth"):
                object.__setattr__(self, name, as_count(getattr(self, name), name, 1, MAX_COUNT))
        if self.lyap_warmup is None and self.steps is not None:
            object.__setattr__(self, "lyap_warmup", derived_warmup(self.steps))
        if self.lyap_warmup is not None:
            top = self.steps if self.steps is not None else LADDERS["steps"][0]
            check(not isinstance(self.lyap_warmup, bool) and isinstance(self.lyap_warmup, int) and 0 <= self.lyap_warmup < top,
                  f"lyap_warmup: got {self.lyap_warmup!r}; it must be an integer in [0, {top - 1}] (below steps = {top}; "
                  f"leave it out for a tenth of the steps, here {derived_warmup(top)})")
        if self.exponents is not None:
            object.__setattr__(self, "exponents", as_count(self.exponents, "exponents", 1, MAX_COUNT))
        check(self.qr_dtype in QR_DTYPE_NAMES, f"qr_dtype: got {self.qr_dtype!r}; valid values are {', '.join(QR_DTYPE_NAMES)}")
        check_seconds(self.budget_seconds, "budget_seconds")
        object.__setattr__(self, "seed", as_seed(self.seed, "seed"))
        check(self.seed < 2**63 - 1, f"seed: got {self.seed}; it must be below {2**63 - 1} (trajectories use seed + 1)")
        check(isinstance(self.device, str), f"device: got {self.device!r}; expected a device name such as cpu")

    @property
    def resolved(self) -> bool:
        """Whether every option the plan chooses is set (as :attr:`DynamicsPlan.options` is)."""
        return None not in (self.parts, self.sequences, self.grid_sequences, self.trajectories, self.steps)

    def filled(self) -> "DynamicsOptions":
        """Every option left out set to the largest it may take (the defaults before issue #37)."""
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
class AccuracyOptions:
    """Each field is named as its ``gradscope accuracy`` flag. ``grid``: None = evaluate the grid when
    the checkpoint has one; True = require it, False = skip it. ``batch_size``: sequences per forward pass.
    ``decoding`` (feedback models, paper App. B.2): both = self-fed (autoregressive, the main
    figures) and ground-truth fed (teacher) side by side, or one of them. ``resamples``: bootstrap
    resamples of the per-position cosine-similarity intervals (vector tasks; None: 10,000), seeded by
    ``seed`` (None: 0). An option given (not None) where it does not apply (resamples or seed on a
    token task, corpus on a checkpoint that is not lm) is refused, not ignored."""

    # None: 4 (quarters) where there is a grid
    bins: int | tuple[int, ...] | str | None = option(None, 'Target-position bins of the grid: a count or 0-based edges (0,8,64). Default: 4 (quarters; one per position on a shorter grid); refused for a checkpoint without a grid.')
    grid: bool | None = option(None, 'Require (--grid) or skip (--no-grid) the frequency grid. Default: evaluate it when the checkpoint has one.')
    device: str = option("auto", 'auto (cuda when present), cpu, cuda or cuda:N.')
    batch_size: int = option(1024, 'Sequences per forward pass (with --text: rows per forward pass, default 16).')
    decoding: str = option("both", 'Feedback models (trained with --decoding): both (self-fed and ground-truth fed, side by side), autoregressive or teacher.')
    resamples: int | None = option(None, 'Bootstrap resamples: of the per-position cosine-similarity CIs (reverse-continuous; default 10,000), or with --text of the CIs over paragraphs (default 1,000).')
    seed: int | None = option(None, 'Seed of the bootstrap resamples (reverse-continuous, or --text; default 0).')
    # lm checkpoints: read this corpus directory instead of the recorded one
    corpus: str | None = option(None, "lm checkpoints: the corpus directory, if it moved since training (its manifest must match the run's).")
    chunk: InitVar[int | None] = None  # batch_size's name before issue #24 (a keyword only; read batch_size)

    def __post_init__(self, chunk: int | None) -> None:
        renamed_field(self, "chunk", chunk, "batch_size")
        if isinstance(self.bins, str):  # as the flag gives it: '4' or '0,8,64'
            object.__setattr__(self, "bins", parse_bins(self.bins))
        object.__setattr__(self, "batch_size", as_count(self.batch_size, "batch_size", 1, MAX_COUNT))
        one_of("decoding", self.decoding, DECODING_CHOICES)
        if self.resamples is not None:
            as_int(self.resamples, "resamples", 1, MAX_RESAMPLES)
        if self.seed is not None:
            as_int(self.seed, "seed", 0, MAX_SEED)

    def bins_for(self, length: int | None) -> int | tuple[int, ...]:
        """The bins of a grid of ``length`` target positions: as given, else quarters (fewer bins when
        the grid has fewer than 4 positions: the default must not fail where the grid is short)."""
        if self.bins is not None:
            return self.bins
        return DEFAULT_BINS if length is None else min(DEFAULT_BINS, length)

    @property
    def resamples_used(self) -> int:
        return 10_000 if self.resamples is None else self.resamples

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
    unit: str = option("trial", "Resampling unit: trial (seeds, as in the paper) or token (pooled "
                                "tokens/sequences/triplets).")
    resamples: int = option(10_000, "Bootstrap resamples.")
    ci: float = option(0.95, "Confidence level.")
    # its name before issue #39 was method, which is stability's Jacobian engine (the old name is a hidden flag and a
    # keyword, both warning); summary stores still record it as their "method" attribute
    interval: str = option("percentile", "Interval: {intervals} (percentile is the paper's; t is Student t, "
                                         "better coverage with few trials).")
    metric: tuple[str, ...] = option((), "Metrics to show (repeatable; 'all' for every one). Default: the main ones. "
                                         "The store always holds all.")
    score: str = option("default", "Stability stores: which score to summarize: {scores}.")
    compare: str | None = option(None, "A --by field with two values (e.g. pe): paired permutation test between "
                                       "them, by seed.")
    checkpoints: str = option("last", "Which checkpoints of each store: last, or all (with --compare: the seed-level "
                                      "interval of the difference at every training iteration, and the test of "
                                      "whether it opens from the first to the last; docs/cli.md).")
    margin: float = option(0.05, "With --checkpoints all and --compare: the equivalence margin of the test's 'no "
                                 "effect' (both t-intervals inside ±margin).", low=0)
    seed: int = option(0, "Seed of the bootstrap and permutation resampling.")
    method: InitVar[str | None] = None  # interval's name before issue #39 (a keyword only; read interval)

    def __post_init__(self, method: str | None) -> None:
        renamed_field(self, "method", method, "interval")  # stability's --method is the Jacobian engine
        check(self.kind is None or self.kind in SUMMARIZED,
              f"kind: got {self.kind!r}; valid kinds are {', '.join(SUMMARIZED)}")
        if isinstance(self.by, (tuple, list)):
            object.__setattr__(self, "by", ",".join(self.by))
        check(isinstance(self.by, str), f"by: got {type(self.by).__name__}; expected field names (core,pe)")
        items = [v.strip() for v in self.by.split(",")]
        check(all(items), f"by: got {self.by!r}, an empty list or an empty item; give comma-separated fields such "
                          f"as core,pe (an empty one would pool every configuration into one group)")
        one_of("unit", self.unit, UNITS)
        object.__setattr__(self, "resamples", as_count(self.resamples, "resamples", 1, MAX_RESAMPLES))
        check(isinstance(self.ci, (int, float)) and not isinstance(self.ci, bool) and 0 < self.ci < 1,
              f"ci: got {self.ci!r}; it must lie strictly between 0 and 1")
        one_of("interval", self.interval, INTERVALS)
        check(isinstance(self.metric, (tuple, list)) and all(isinstance(m, str) for m in self.metric),
              f"metric: got {self.metric!r}; expected metric names")
        object.__setattr__(self, "metric", tuple(self.metric))
        check(isinstance(self.score, str), f"score: got {self.score!r}; expected default, frobenius or l1")
        one_of("checkpoints", self.checkpoints, CHECKPOINTS)
        check(isinstance(self.margin, (int, float)) and not isinstance(self.margin, bool)
              and math.isfinite(self.margin) and self.margin >= 0,
              f"margin: got {self.margin!r}; it must be a finite number ≥ 0")
        object.__setattr__(self, "margin", float(self.margin))
        object.__setattr__(self, "seed", as_seed(self.seed))
