"""Field checks and dict → dataclass conversion shared by every frozen config."""

from __future__ import annotations

import dataclasses
import math
import operator
from pathlib import Path
from typing import Any, TypeVar

from gradscope.errors import GradscopeError, check

C = TypeVar("C")


def one_of(name: str, value: object, valid: tuple[str, ...] | list[str]) -> None:
    check(value in valid, f"{name}: got {value!r}; valid values are {', '.join(valid)}")


def positive(name: str, value: float) -> None:
    check(value > 0, f"{name}: got {value}; it must be positive")


def from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Build config ``cls`` from a plain dict (JSON or checkpoint), rejecting unknown keys."""
    check(isinstance(data, dict), f"{cls.__name__}: expected a mapping of fields; got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise GradscopeError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}")
    clean = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return cls(**clean)


def option(default: Any, help: str, *, short: str | None = None, alias: str | None = None,
           low: float | None = None, high: float | None = None, exclusive: str = "",
           choices: tuple[str, ...] | None = None, flag: str | None = None, also: tuple[str, ...] = ()) -> Any:
    """A config field that is also a user-facing setting: ``gradscope train --<name>``, a sweep axis,
    a summary field (``--by <alias>``) and a report label (``<short>=value``). ``low``/``high``: its range
    (``exclusive``: "low", "high" or "both" ends open) and ``choices``: the values it may take, declared once
    here; :func:`check_fields` enforces them and the CLI's help states them. ``flag``: the setting's name
    where it is not the field's own (the task's ``name`` is ``--task``, as its errors say); ``also``: more
    spellings of the flag (``--model`` for ``--model-factory``)."""
    check(exclusive in ("", "low", "high", "both"), f"exclusive: got {exclusive!r}")
    return dataclasses.field(default=default, metadata={"help": help, "short": short, "alias": alias,
                                                        "range": (low, high), "exclusive": exclusive,
                                                        "choices": choices, "flag": flag, "also": also})


def shown(value: Any) -> str:
    """A value from outside as one short line: the repr of a plain scalar, else its type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return f"a {type(value).__name__}"


def integer(name: str, value: Any, low: int, high: int) -> None:
    """A config field that must be an int (not a bool or a float) within [low, high]."""
    check(isinstance(value, int) and not isinstance(value, bool), f"{name}: got {shown(value)}; expected an integer")
    as_int(value, name, low, high)


def real(name: str, value: Any, low: float, high: float = math.inf, *, above: bool = False,
         below: bool = False) -> None:
    """A config field that must be a finite real number in [low, high] (``above``/``below``: open at
    that end)."""
    check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
          f"{name}: got {shown(value)}; expected a finite number")
    ok = (value > low if above else value >= low) and (value < high if below else value <= high)
    check(ok, f"{name}: got {value}; it must be {'>' if above else '>='} {low}"
              + (f" and {'<' if below else '<='} {high}" if math.isfinite(high) else ""))


def text(name: str, value: Any, valid: tuple[str, ...] | list[str]) -> None:
    """A config field that must be one of the strings ``valid``."""
    check(isinstance(value, str), f"{name}: got {shown(value)}; valid values are {', '.join(valid)}")
    one_of(name, value, valid)


def bounded(default: Any, *, low: float | None = None, high: float | None = None, exclusive: str = "") -> Any:
    """A field with a range but no flag (no help): :func:`check_fields` checks it as an :func:`option`'s."""
    return dataclasses.field(default=default, metadata={"range": (low, high), "exclusive": exclusive})


def _bounds_text(low: float | None, high: float | None, exclusive: str) -> str:
    """How a real field's range reads in an error: "lie strictly between 0 and 1", "be a finite number ≥ 0"."""
    open_low, open_high = exclusive in ("low", "both"), exclusive in ("high", "both")
    if low is not None and high is not None:
        if open_low and open_high:
            return f"lie strictly between {low:g} and {high:g}"
        return (f"be a number in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}")
    if low is not None:
        return f"be a finite number {'>' if open_low else '≥'} {low:g}"
    return f"be a finite number {'<' if open_high else '≤'} {high:g}"


def check_fields(obj: Any, *, strict: bool = False) -> None:
    """Every field of the frozen dataclass ``obj`` declared with a range or choices (:func:`option`) checked, in
    one line naming the field, and an integer field's value made an int (an integral float or a numpy integer
    is accepted): the bounds live on the fields, and ``__post_init__`` keeps only the rules between fields.
    A field whose default is None may be None. ``strict`` (a run's configuration, read from files): an integer
    field takes an int only (:func:`integer`), a real field a finite number (:func:`real`), each as it is."""
    for f in dataclasses.fields(obj):
        low, high = f.metadata.get("range", (None, None))
        choices = f.metadata.get("choices")
        value = getattr(obj, f.name)
        if (low is None and high is None and choices is None) or (value is None and f.default is None):
            continue
        if choices is not None:
            one_of(f.name, value, choices)
            continue
        kind = str(f.type)
        exclusive = f.metadata.get("exclusive", "")
        if strict:
            if "float" not in kind and "int" in kind:
                integer(f.name, value, low, high)  # type: ignore[arg-type]
            else:
                real(f.name, value, low if low is not None else -math.inf, high if high is not None else math.inf,
                     above=exclusive in ("low", "both"), below=exclusive in ("high", "both"))
            continue
        if "float" not in kind and "int" in kind:
            object.__setattr__(obj, f.name, as_count(value, f.name, low, high))  # type: ignore[arg-type]
            continue
        open_low, open_high = exclusive in ("low", "both"), exclusive in ("high", "both")
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and (low is None or (value > low if open_low else value >= low)) \
            and (high is None or (value < high if open_high else value <= high))
        check(ok, f"{f.name}: got {value!r}; it must {_bounds_text(low, high, exclusive)}")
        object.__setattr__(obj, f.name, float(value))


# --- the values options take, declared once and torch-free (a command's --help reads them) ---------

GROUPS = ("frequent", "rare", "all")  # probe token groups (docs/definitions.md §3's dual vocabulary; all: the whole of it)
ENGINES = ("func", "vjp", "analytic")  # the Jacobian engines (gradscope.analysis.jacobian.METHODS)
ESTIMATORS = ("auto", "exact", "sketch")  # exact stability Jacobians, or a sketch with standard errors
SCORE_KINDS = ("default", "frobenius", "l1")  # the stability scores (gradscope.analysis.scores.SCORES, same order)
PARTS = ("flow", "grid", "spectra", "gates", "lyapunov")  # the dynamics parts (gradscope.workflows.dynamics)
DEFAULT_BINS = 4  # target positions are reported in quarters unless told otherwise
MAX_RESAMPLES = 10_000_000  # beyond this a bootstrap takes hours and its CI no longer changes
INTERVALS = ("percentile", "bca", "basic", "t")  # confidence-interval methods of the bootstrap (and Student t)
CHECKPOINTS = ("last", "all")  # which checkpoints of a store `gradscope summarize` reads
BANDS = ("seeds", "triplets")  # what the report's stability band is over when a configuration has several seeds
SCALES = ("tiny", "paper")  # the presets' scales: CPU-sized, and the paper's (docs/definitions.md §3)
MAX_VOCAB = 2**24  # corpus pieces; SentencePiece parses the size as a 32-bit int, and no corpus supports more


def listed(names: tuple[str, ...] | list[str], last: str = "or") -> str:
    """Names for a help text: "a, b or c"."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def leave_out(names: list[str], why: str) -> str:
    """A refusal of the options ``names``, named first (a command prints them as its flags), then ``why``:
    "a/b: why; leave them out"."""
    return f"{'/'.join(names)}: {why}; leave {'them' if len(names) > 1 else 'it'} out"


def named_choices() -> dict[str, str]:
    """The torch-free registries' placeholders for help texts: ``{scores}``, ``{parts}``, ``{estimators}``,
    ``{engines}``, ``{groups}``, ``{intervals}`` → "a, b or c" (:func:`gradscope.presets.with_choices` adds
    the tasks, cores and PE kinds)."""
    return {"{scores}": listed(SCORE_KINDS), "{parts}": listed(PARTS, "and"), "{estimators}": listed(ESTIMATORS),
            "{engines}": listed(ENGINES), "{groups}": listed(GROUPS), "{intervals}": listed(INTERVALS)}


def with_names(text: str) -> str:
    """A help text with :func:`named_choices`' placeholders replaced, so no list of choices is typed by hand."""
    if "{" in text:
        for placeholder, names in named_choices().items():
            text = text.replace(placeholder, names)
    return text


# --- integers from outside, torch-free (the CLI's help builds options without loading torch) ---------

MAX_COUNT = 2**31 - 1  # sizes, positions and counts of options: beyond this none fits in memory anyway
MAX_SEED = 2**63 - 1  # what torch and numpy generators accept


def as_int(value: Any, what: str, low: int | None = None, high: int | None = None) -> int:
    """An integer from outside (a file field or an option): an int, an integral float or a 0-d
    integer tensor, within [low, high]. Anything else (bool, str, NaN, 1e30) is a user error."""
    if type(value).__module__.startswith("torch") and callable(getattr(value, "dim", None)) \
            and value.dim() == 0 and not value.is_meta and str(value.layout) == "torch.strided":
        value = value.item()  # a 0-d tensor (recognised without importing torch)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GradscopeError(f"{what}: got {type(value).__name__} {str(value)[:40]!r}; expected an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value) or abs(value) > 2**62:
            raise GradscopeError(f"{what}: got {value!r}; expected an integer")
        value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low} and {high}" if low is not None and high is not None else \
            (f"at least {low}" if low is not None else f"at most {high}")
        raise GradscopeError(f"{what}: got {value}; it must be {bounds}")
    return int(value)


def as_count(value: Any, what: str, low: int = 1, high: int | None = None) -> int:
    """An integer option (an int, an integral float or a numpy integer) within [low, high]."""
    if not isinstance(value, (bool, float, int)) and hasattr(value, "__index__"):
        value = operator.index(value)  # numpy integers
    return as_int(value, what, low, high)


def as_seed(value: Any, what: str = "seed") -> int:
    """A seed from outside: an integer in 0 … 2**63 − 1 (what torch and numpy generators accept)."""
    return as_count(value, what, 0, MAX_SEED)


def check_seconds(value: Any, what: str) -> None:
    """A time budget from outside: a positive, finite number of seconds (not a bool)."""
    check(isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf,
          f"{what}: got {value!r}; it must be a positive number of seconds")


# --- default values of settings that several functions and options take, declared once ---------------

DEFAULT_DEVICE = "auto"  # where models run: cuda when present, else cpu (gradscope.train.device.resolve_device)
RESAMPLES = 10_000  # bootstrap resamples of a confidence interval
CONFIDENCE = 0.95  # the level of confidence intervals (bootstrap and Student t)
INTERVAL = "percentile"  # the bootstrap interval method (one of INTERVALS): the paper's
DEFAULT_SCORE = "default"  # the stability score shown and summarized (one of SCORE_KINDS)
BAND = "seeds"  # what the report's stability band is over (one of BANDS)
SUMMARY_CHECKPOINTS = "last"  # which checkpoints of a store summarize reads (one of CHECKPOINTS)
EQUIVALENCE_MARGIN = 0.05  # the trend test's "no effect" margin: both t-intervals inside ±margin
JACOBIAN_METHOD = "auto"  # the Jacobian engine: analytic where the core has one, else vjp (or one of ENGINES)
JACOBIAN_CHUNK = 64  # sequences whose Jacobians (or gradient-flow chains) are computed at once (bounds memory)
ESTIMATOR = "auto"  # exact stability Jacobians where they fit the budget, else a sketch (one of ESTIMATORS)
CHECKPOINT_BUDGET_SECONDS = 600.0  # estimated time allowed per checkpoint before exact gives way to a sketch
PREDICT_CHUNK = 1024  # held-out sequences per forward pass when predicting (bounds the working memory)
RARITY = 0.125  # dual distribution: the probability that a position holds a Rare token (docs/definitions.md §3)
DT_MIN = 1e-3  # S4D and Mamba: the smallest initial step size Δ (log-uniform in [DT_MIN, DT_MAX])
DT_MAX = 1e-1  # S4D and Mamba: the largest initial step size Δ


def with_overrides(cls: type[C], opts: C | None, overrides: dict[str, Any], where: str) -> C:
    """The options a public function runs with: ``opts`` (None: ``cls``'s defaults) with each of ``overrides``
    (field names, as the command's flags) set; a name that is not a field of ``cls`` is one error naming it."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - set(names))
    check(not unknown, f"{unknown[0] if unknown else ''}: not an option of {where}; its options are {', '.join(names)}")
    check(opts is None or isinstance(opts, cls), f"opts: got {type(opts).__name__}; expected {cls.__name__}(…)")
    return dataclasses.replace(opts, **overrides) if opts is not None else cls(**overrides)


def as_path(opts: Any, name: str) -> None:
    """Field ``name`` of the frozen ``opts`` as a Path (None stays None; a str becomes a Path)."""
    value = getattr(opts, name)
    check(value is None or isinstance(value, (str, Path)), f"{name}: got {type(value).__name__}; expected a path")
    if isinstance(value, str):
        object.__setattr__(opts, name, Path(value))
