"""The options of `gradscope report`, `reproduce`, `sweep` and `corpus prepare`, declared once, as gradscope/workflows/options.py declares those of the analysis commands: each field made
with :func:`gradscope.fields.option` carries its help and is the command's ``--<field>`` flag (the CLI
generates the flags, ``cli/generated.py``); the checks run only in ``__post_init__``; the Python
functions take the same names. Torch-free (and plotly-free), so that a command's ``--help`` builds its
options without loading either. What a command reads (its arguments) and writes (``--out``, ``--overwrite``), and
``--quiet``, stay the command's own."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from gradscope.errors import GradscopeError, check
from gradscope.fields import (BANDS, DEFAULT_DEVICE, DEFAULT_SCORE, MAX_COUNT, MAX_RESAMPLES, MAX_SEED, MAX_VOCAB,
                              RESAMPLES, SCALES, as_path, bounded, check_fields, option)
from gradscope.workflows.options import (COUNTS_TEXT_HELP, DEFAULT_BUDGET, HF, PROBE_LENGTH, PROBE_TARGET_POS,
                                         TEXT_MAX_LENGTH, TEXT_RESAMPLES, TRIPLETS)
from gradscope.workflows.study.lm_options import LMStudyOptions

STATIC_FORMATS = ("png", "svg")  # what `gradscope report --static` writes beside the HTML


@dataclass(frozen=True, kw_only=True)
class ReportOptions:
    """How `gradscope report` draws its stores; each field is named as its flag. ``score``: the stability
    score plotted; ``iteration``: checkpoint for distributions, spectra and the accuracy grid (None: each
    store's last); ``resamples``/``seed``: the stability bootstrap; ``static``: also each figure as png or
    svg; ``command``: the command that made the report (shown in its header)."""

    static: str | None = option(None, "Also write each figure as png or svg beside the HTML (needs kaleido>=1 and "
                                      "Chrome/Chromium on PATH).")
    score: str = option(DEFAULT_SCORE, "Stability score to plot: {scores}.")
    iteration: int | None = option(None, "Checkpoint (training iteration) for distributions, spectra and the accuracy "
                                         "grid. Default: each store's last.")
    resamples: int = option(RESAMPLES, "Bootstrap resamples for the stability CIs.", low=1, high=MAX_RESAMPLES)
    seed: int = option(0, "Seed of the stability bootstrap.", low=0, high=MAX_SEED)
    band: str = option(BANDS[0], "Stability over training, for a configuration with stores of several seeds: the band "
                                "over seeds (the seeds' mean scores, a Student t-interval; each seed's line one click "
                                "away in the legend) or over triplets (all seeds' triplets pooled, a bootstrap CI).", choices=BANDS)
    title: str = option("gradscope report", "Title of the report.")
    command: str = ""

    def __post_init__(self) -> None:
        check(self.static is None or self.static in STATIC_FORMATS,
              f"static: got {self.static!r}; valid formats are {', '.join(STATIC_FORMATS)}")
        check(isinstance(self.score, str), f"score: got {self.score!r}; expected default, frobenius or l1")
        check_fields(self)


def _items(value: object, name: str, example: str) -> tuple[str, ...]:
    """A comma-separated option (``"gru,lstm"``, as the flag gives it) or a sequence, as a tuple of
    stripped items; an empty list or an empty item is an error naming ``name``, never "the default"."""
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
        check(any(items), f"{name}: got {value!r}, an empty list; give comma-separated values such as {example}")
        check(all(items), f"{name}: got {value!r}, which has an empty item; give comma-separated values such as "
                          f"{example}")
        return tuple(items)
    check(isinstance(value, (tuple, list)), f"{name}: got {value!r}; give comma-separated values such as {example}")
    check(len(value) > 0, f"{name}: the list is empty; leave it out for the study's default")
    return tuple(value)


SYNTHETIC = "reverse"  # the synthetic study (docs/definitions.md §3), the default: its runs are study/runs.py's
STUDY_BASES = (LMStudyOptions,)  # one base per other study with options of its own (its name, notes and rules)
STUDIES = (SYNTHETIC, *(b.STUDY for b in STUDY_BASES))


def _notes(key: str) -> str:
    """What each other study's help says of shared option ``key``: " (lm: …)"."""
    return "".join(f" ({b.STUDY}: {b.NOTES[key]})" for b in STUDY_BASES if key in b.NOTES)


@dataclass(frozen=True, kw_only=True)
class StudyOptions(*STUDY_BASES):  # type: ignore[misc]
    """The synthetic study (``study="reverse"``, docs/definitions.md §3) or another study of :data:`STUDY_BASES`
    (each declares its own options, defaults and rules: the language-modelling study, study/lm_options.py), each
    field named as its `gradscope reproduce` flag. None: the study's default (models gru, lstm, s4d; seeds 1, 2,
    3; another study's own). ``models``/``seeds`` may be comma-separated text, as the flags give them.
    ``extend_to``: also the vocabulary-extension experiment (paper §4.2)."""

    study: str = option(SYNTHETIC, "reverse: the synthetic study (docs/definitions.md §3); " +
                        "; ".join(f"{b.STUDY}: {b.ABOUT}" for b in STUDY_BASES) + ".")
    scale: str = option("tiny", "tiny: the CPU-scale study (≈5–10 min per run on 2 cores); paper: docs/definitions.md §3, "
                                f"for a GPU{_notes('scale')}.")
    models: tuple[str, ...] | str | None = option(None, "Comma-separated cores (names in the core registry; the study "
                                                        "of the docs ran gru, lstm, s4d, mingru and mamba). Default: "
                                                        f"gru,lstm,s4d{_notes('models')}.")
    seeds: tuple[int, ...] | str | None = option(None, "Comma-separated training seeds (trials). Default: "
                                                       f"1,2,3{_notes('seeds')}.")
    iterations: int | None = option(None, "Override the scale's training iterations (for a quick look).", low=1)
    triplets: int = option(TRIPLETS, "Stability probe triplets per condition.", low=1, high=MAX_COUNT)
    extend_to: int | None = option(None, "Also run the vocabulary-extension experiment (paper §4.2): extend each study "
                                         "run (vocabulary K) to this K' (only the new rows train, on uniform data over "
                                         "K' items) and train from scratch at K'; writes extension/table.md.")
    extend_iterations: int | None = option(None, "Training iterations of each extension (default: as many as the "
                                                 "study's runs).", low=1)

    def __post_init__(self) -> None:
        check(self.study in STUDIES, f"study: got {self.study!r}; valid studies are {', '.join(STUDIES)}")
        check(self.scale in SCALES, f"scale: got {self.scale!r}; valid scales are {', '.join(SCALES)}")
        check_fields(self)
        if self.models is not None:
            object.__setattr__(self, "models", _items(self.models, "models", "gru,lstm"))
        if self.seeds is not None:
            seeds = _items(self.seeds, "seeds", "1,2,3")
            try:
                seeds = tuple(int(s) if isinstance(s, str) else s for s in seeds)
            except ValueError:
                raise GradscopeError(f"seeds: got {self.seeds!r}; give comma-separated integers such as 1,2,3") from None
            object.__setattr__(self, "seeds", seeds)
        for name in ("models", "seeds"):
            value = getattr(self, name)
            if value is not None:
                check(len(set(value)) == len(value), f"{name}: got {', '.join(map(str, value))}; a value repeats "
                                                     f"(each names its runs)")
        for base in STUDY_BASES:  # each study's rules between the study and its own options
            base.check_study(self)
        if self.extend_to is not None or self.extend_iterations is not None:
            check(self.study == SYNTHETIC and self.extend_to is not None,
                  "extend_to/extend_iterations: the extension experiment extends the synthetic study's runs "
                  "(study reverse); give extend_to K'")
            check(self.extend_to <= MAX_COUNT, f"extend_to: got {self.extend_to}; it must be at most {MAX_COUNT}")


@dataclass(frozen=True, kw_only=True)
class ReproduceOptions:
    """What `gradscope reproduce` runs, besides the study's own options: ``dry_run``, the plan alone (each
    model's training steps timed when ``measure``: :func:`gradscope.workflows.study.reproduce.estimate_seconds`);
    ``model_dir``, a pretrained LM's study of a text instead (its options: :class:`TextStudyOptions`,
    :func:`gradscope.workflows.text.study.reproduce_text`). Each field is named as its flag."""

    dry_run: bool = option(False, "Print the plan and estimated compute; train nothing (a study on a text corpus "
                                  "prepares the corpus first: the plan needs its vocabulary).")
    measure: bool = option(True, "With --dry-run: time a few training steps per model to estimate CPU time.")
    model_dir: Path | None = option(None, "With --text: a pretrained LM's save_pretrained directory, its tokenizer "
                                          "beside it: accuracy, stability and dynamics by token frequency on the text, "
                                          "and the report, into --out (docs/real-text.md).")

    def __post_init__(self) -> None:
        as_path(self, "model_dir")


@dataclass(frozen=True, kw_only=True)
class SweepOptions:
    """What `gradscope sweep` does with its grid (where the points run: :class:`ClusterOptions`); ``dry_run``:
    print the grid and what is already done, and run nothing (:func:`gradscope.workflows.sweep.grid.plan_points`
    from Python). Named as its flag."""

    dry_run: bool = option(False, "Print the grid and what is already done; run nothing.")


@dataclass(frozen=True, kw_only=True)
class TextStudyOptions:
    """`gradscope reproduce --model-dir DIR --text FILE`'s study of a pretrained LM on a raw text; each field is
    named as its flag (``text`` … ``budget_seconds``; ``triplets``, ``target_pos`` and ``probe_length`` are the
    flags :class:`StudyOptions` declares, shared by both studies); the defaults finish in a few minutes on a
    laptop CPU for a small model (docs/real-text.md). ``target_pos``/``probe_length``: the stability probes'
    target (paragraph token) and row length (start token included; dynamics' rows too); ``triplets`` per
    condition (targets frequent and rare, disturbants the text as it is); ``max_length``/``resamples``:
    accuracy's; ``budget_seconds``: dynamics' whole budget (stability decides exact or sketch by its own, ten
    times it). Every field is part of the study's identity (a finished store of other options is refused)."""

    text: str = option(dataclasses.MISSING, "With --model-dir: the raw UTF-8 text the study runs on.")
    counts_text: str | None = option(None, COUNTS_TEXT_HELP)
    tokenizer: str | None = option(None, "With --text: the folder of the model's tokenizer (default: the --model-dir "
                                         "directory).")
    triplets: int = bounded(TRIPLETS, low=1, high=MAX_COUNT)
    target_pos: int = bounded(PROBE_TARGET_POS, low=1, high=MAX_COUNT)
    probe_length: int = bounded(PROBE_LENGTH, low=2, high=MAX_COUNT)
    max_length: int = option(TEXT_MAX_LENGTH, "With --text: accuracy's tokens per row (longer paragraphs are scored in "
                                   "overlapping windows).")
    resamples: int = option(TEXT_RESAMPLES, "With --text: accuracy's bootstrap resamples over paragraphs.")
    seed: int = option(0, "With --text: the seed of the probes, trajectories and bootstrap.")
    budget_seconds: float = option(DEFAULT_BUDGET, "With --text: dynamics' time budget (stability's is ten times it).",
                                   low=0, exclusive="low")
    model_factory: str = option(HF, "With --text: how the --model-dir directory loads: hf or hf:CLASS.")
    device: str = DEFAULT_DEVICE

    def __post_init__(self) -> None:
        # the ranges (the probes' own, named as the study's options, before any work: the stability and dynamics
        # steps would name theirs, length and target_pos, only after the accuracy store is written); a budget is
        # made a float, so 20 from Python and 20.0 from the command line are one study (its key records it)
        check_fields(self)
        check(self.target_pos <= self.probe_length - 1,
              f"target_pos: got {self.target_pos}; a probe row of probe_length {self.probe_length} holds paragraph "
              f"tokens 1…{self.probe_length - 1} before its last (give a smaller target_pos or a larger probe_length)")


SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")  # dask's network transports
ADDRESS = re.compile(r"^(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)"
                     r":(?P<port>[0-9]{1,5})$")
MAX_THREADS = 4096
MAX_RETRIES = 100


def parse_resources(text: str | None) -> dict[str, float]:
    """"GPU=1,MEM=4e9" → {"GPU": 1.0, "MEM": 4e9}."""
    out: dict[str, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            sep = ""
        amount = out.get(name.strip(), 0.0)
        check(bool(sep) and bool(name.strip()) and math.isfinite(amount) and amount > 0,
              f"resources: got {text!r}; give NAME=AMOUNT pairs such as GPU=1 (comma-separated)")
    return out


@dataclass(frozen=True, kw_only=True)
class ClusterOptions:
    """Where `gradscope sweep` runs its points; each field is named as its flag. ``scheduler``: address of
    an existing scheduler (else a LocalCluster of ``workers`` processes × 1 thread; the memory they need
    is checked when the cluster is made, :func:`gradscope.workflows.sweep.cluster.open_client`); ``threads``:
    torch threads per task (None: the host's cores divided by the task slots on that host);
    ``resources``: dask resources each task needs, e.g. {"GPU": 1} (or "GPU=1", as the flag gives it);
    ``retries``: re-runs of a task that raised an error."""

    scheduler: str | None = option(None, "Address of a running dask scheduler, e.g. tcp://host:8786 (default: start a "
                                         "local cluster).")
    workers: int | None = option(None, "Local cluster: worker processes (1 thread each; default: the CPU cores, at "
                                       "most one per point).", low=1, high=MAX_COUNT)
    threads: int | None = option(None, "torch threads per task (default: a host's cores divided by its workers' "
                                       "threads).", low=1, high=MAX_THREADS)
    resources: dict[str, float] | str = field(default_factory=dict, metadata={
        "help": "dask resources each task needs, e.g. GPU=1 (workers must offer them: `dask worker … --resources "
                "GPU=1`)."})
    retries: int = option(0, "Re-run a point this many times when it raises an error (a killed worker is always "
                             "retried by dask).", low=0, high=MAX_RETRIES)

    def __post_init__(self) -> None:
        if self.scheduler is not None:
            m = ADDRESS.match(self.scheduler) if isinstance(self.scheduler, str) else None
            check(m is not None and (m["scheme"] or "tcp") in SCHEMES and 1 <= int(m["port"]) <= 65535,
                  f"scheduler: got {str(self.scheduler)[:80]!r}; expected a dask scheduler address "
                  f"[SCHEME://]HOST:PORT with SCHEME one of {', '.join(SCHEMES)}, e.g. tcp://host:8786")
            check(self.workers is None, "workers: it sizes a local cluster; with scheduler (--scheduler), start workers with "
                                        "`dask worker ADDRESS` instead")
        check_fields(self)
        if isinstance(self.resources, str):
            object.__setattr__(self, "resources", parse_resources(self.resources))
        check(isinstance(self.resources, dict) and all(
            isinstance(k, str) and k and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v) and v > 0 for k, v in self.resources.items()),
            f"resources: got {self.resources!r}; give NAME=AMOUNT pairs with finite positive amounts, such as GPU=1")



MODEL_TYPES = ("unigram", "bpe", "char", "word")  # SentencePiece's model types
SPLIT_FRACTIONS = ("valid", "test", "split_seed")  # CorpusOptions' fields that split one file's paragraphs


@dataclass(frozen=True, kw_only=True)
class CorpusOptions:
    """How `gradscope corpus prepare` makes a corpus; each field is named as its flag. ``valid``/``test``:
    fractions of the paragraphs held out when one file is given (a seeded permutation,
    :func:`~gradscope.corpus.text.split_paragraphs`); ignored when separate valid and test files are given."""

    # its flag is --vocab (the corpus's own K, as the errors say; a training run's is --vocab-size)
    vocab_size: int = option(32_768, "SentencePiece pieces K (the paper: 32768).", flag="vocab")
    model_type: str = option(MODEL_TYPES[0], "SentencePiece model type: unigram (SentencePiece's and torchtext's "
                                             "default), bpe, char or word.", choices=MODEL_TYPES)
    character_coverage: float = option(0.9995, "Share of characters the pieces must cover (the rest map to <unk>).",
                                       low=0.9, high=1.0)
    valid: float = option(0.05, "Without split files: fraction of paragraphs held out for valid.")
    test: float = option(0.05, "Without split files: fraction of paragraphs held out for test.")
    split_seed: int = option(0, "Without split files: seed of the paragraph permutation.", low=0, high=MAX_SEED)
    # the held-out splits as files of their own: then valid/test/split_seed, which split one file, do not apply
    valid_file: Path | None = option(None, "Separate valid split (with --test-file), e.g. wiki.valid.raw.")
    test_file: Path | None = option(None, "Separate test split (with --valid-file), e.g. wiki.test.raw.")

    def __post_init__(self) -> None:
        check(isinstance(self.vocab_size, int) and not isinstance(self.vocab_size, bool)
              and 4 <= self.vocab_size <= MAX_VOCAB,
              f"vocab: got {self.vocab_size!r}; need an integer in 4…{MAX_VOCAB:,}")
        for name in ("valid_file", "test_file"):
            as_path(self, name)
        check_fields(self)
        check((self.valid_file is None) == (self.test_file is None), "valid_file/test_file: give both, or neither")
        if self.valid_file is not None:
            split = [f.name for f in dataclasses.fields(self) if f.name in SPLIT_FRACTIONS
                     and getattr(self, f.name) != f.default]
            check(not split, f"{'/'.join(split)}: they split one file's paragraphs; with valid_file and test_file the "
                             f"held-out splits are those files")

    def recorded(self) -> dict[str, object]:
        """The settings a corpus's manifest records: the split files are recorded as its sources instead."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("valid_file", "test_file")}
