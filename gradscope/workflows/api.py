"""The analysis commands as Python, one call each and the same from a notebook as from the command line:
``run_<command>(source, opts)`` runs a command on a :class:`~gradscope.workflows.sources.Source` (or anything
:func:`~gradscope.workflows.sources.source_of` resolves) and returns its run; ``<command>(source, *, opts=None,
**overrides)`` returns the run's store as an xarray Dataset, ``overrides`` being any field of the command's
options dataclass or of :class:`~gradscope.workflows.options.SourceOptions`, named as the flags."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import xarray as xr

from gradscope.errors import check
from gradscope.tasks.probes import Probes, validate_probes
from gradscope.workflows.accuracy import AccuracyRun, run_checkpoint_accuracy
from gradscope.workflows.dynamics import (DynamicsPlan, DynamicsRun, run_checkpoint_dynamics, run_factory_dynamics,
                                         run_model_dynamics)
from gradscope.workflows.factory import build_model
from gradscope.workflows.options import (HF, TEXT_BATCH, TEXT_MAX_LENGTH, TEXT_RESAMPLES, AccuracyOptions,
                                         DynamicsOptions, SourceOptions, StabilityOptions, check_read, set_options)
from gradscope.fields import with_overrides
from gradscope.workflows.sources import Source, check_reads, source_of
from gradscope.workflows.stability import StabilityRun, run_checkpoint_stability, run_model_stability
from gradscope.workflows.text.accuracy import TextAccuracyOptions, TextAccuracyRun, run_text_accuracy
from gradscope.workflows.text.probes import run_text_dynamics, run_text_stability

SOURCE_FIELDS = tuple(f.name for f in dataclasses.fields(SourceOptions))


def source(source: Any, *, opts: SourceOptions | None = None, **overrides: Any) -> Source:
    """What a command analyses (:func:`gradscope.workflows.sources.source_of`): ``source`` a checkpoint file or
    run directory, a list of them, a ``Loaded`` checkpoint or a model in memory; ``overrides`` the fields of
    :class:`SourceOptions` (model_factory, config, text, counts_text, tokenizer)."""
    return source_of(source, opts, **overrides)


def _split(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the source's options, the command's) of a function's keywords."""
    return ({k: v for k, v in overrides.items() if k in SOURCE_FIELDS},
            {k: v for k, v in overrides.items() if k not in SOURCE_FIELDS})


def run_stability(source: Any, opts: StabilityOptions, *, probes: Probes | None = None, command: str = "",
                  on_start: Callable[[int], None] | None = None, on_progress: Callable[[int], None] | None = None,
                  on_plan: Callable[[Any], None] | None = None) -> StabilityRun:
    """Gradient stability of ``source`` (checkpoints, a model in memory, a factory's model, or a model on a text)
    with ``opts``; ``probes`` given in memory replace the generated ones (not for a text)."""
    src = source_of(source)
    check_reads(src, opts, "stability")
    hooks = {"on_start": on_start, "on_progress": on_progress, "on_plan": on_plan}
    if src.kind == "checkpoints":
        return run_checkpoint_stability(list(src.paths), opts, probes=probes, command=command, **hooks)
    if src.kind == "text":
        check(probes is None, "probes: with text the probes are drawn from the text")
        assert src.text is not None
        model = src.model if src.model is not None else src.path
        return run_text_stability(model, opts, src.text, model_factory=src.factory or "hf", config=src.config,
                                  command=command, **hooks)
    if src.kind == "factory":
        assert src.factory is not None
        model = build_model(src.factory, src.path, src.config)
        return run_model_stability(model, opts, probes=probes, source=src.path, command=command, **hooks)
    return run_model_stability(src.model, opts, probes=probes, command=command, **hooks)


def run_dynamics(source: Any, opts: DynamicsOptions, *, tokens: torch.Tensor | None = None,
                 trajectory_tokens: torch.Tensor | None = None, counts: torch.Tensor | None = None,
                 command: str = "", on_start: Callable[[int], None] | None = None,
                 on_progress: Callable[[int], None] | None = None,
                 on_plan: Callable[[DynamicsPlan], None] | None = None) -> DynamicsRun:
    """The dynamics view of ``source`` with ``opts``. A model in memory is given its probe sequences ``tokens``
    (n, T) and optionally its Lyapunov ``trajectory_tokens`` and token ``counts`` (see
    :func:`~gradscope.workflows.dynamics.run_model_dynamics`); every other source draws its own."""
    src = source_of(source)
    check_reads(src, opts, "dynamics")
    check(src.kind == "model" or (tokens is None and trajectory_tokens is None and counts is None),
          "tokens/trajectory_tokens/counts: they are a model in memory's probes; this source draws its own")
    check_read(opts.parts, set_options(opts))
    if src.kind == "checkpoints":
        return run_checkpoint_dynamics(list(src.paths), opts, command=command, on_start=on_start,
                                       on_progress=on_progress, on_plan=on_plan)
    if src.kind == "text":
        assert src.text is not None
        model = src.model if src.model is not None else src.path
        return run_text_dynamics(model, opts, src.text, model_factory=src.factory or "hf", config=src.config,
                                 command=command, on_plan=on_plan)
    if src.kind == "factory":
        assert src.factory is not None
        return run_factory_dynamics(src.factory, src.path, opts, command=command, config=src.config, on_plan=on_plan)
    check(tokens is not None, "tokens: give the probe sequences (n, T) to analyse an in-memory model")
    assert tokens is not None
    return run_model_dynamics(src.model, tokens, opts, trajectory_tokens=trajectory_tokens, counts=counts,
                              command=command, on_plan=on_plan)


def run_accuracy(source: Any, opts: AccuracyOptions, *, command: str = "",
                 on_start: Callable[[int], None] | None = None,
                 on_progress: Callable[[int], None] | None = None) -> AccuracyRun | TextAccuracyRun:
    """Accuracy of ``source``: gradscope checkpoints on their held-out sets, or a pretrained LM on a raw text
    (perplexity and accuracy by token frequency and position, bootstrap intervals over paragraphs). A model of
    one's own has no held-out set, so it is read on a text or not at all."""
    src = source_of(source)
    check_reads(src, opts, "accuracy")
    if src.kind == "checkpoints":
        return run_checkpoint_accuracy(list(src.paths), opts, command=command, on_start=on_start,
                                       on_progress=on_progress)
    assert src.text is not None
    text = TextAccuracyOptions(
        text=src.text.text, counts_text=src.text.counts_text, tokenizer=src.text.tokenizer,
        max_length=TEXT_MAX_LENGTH if opts.max_length is None else opts.max_length,
        batch_size=TEXT_BATCH if opts.batch_size is None else opts.batch_size,
        resamples=TEXT_RESAMPLES if opts.resamples is None else opts.resamples,
        seed=0 if opts.seed is None else opts.seed, device=opts.device, cache=src.text.cache)
    return run_text_accuracy(src.model if src.model is not None else src.path, text, model_factory=src.factory or HF,
                             on_start=on_start, on_progress=on_progress, command=command)


def accuracy(source: Any, *, opts: AccuracyOptions | None = None, **overrides: Any) -> xr.Dataset:
    """Accuracy (docs/definitions.md §5) as an xarray Dataset with the variables of an accuracy store.

    source: a checkpoint file or run directory (or a list of them: every checkpoint, oldest first), a
    :class:`~gradscope.files.checkpoint.Loaded` (not read again), or a pretrained LM on a text
    (``accuracy(DIR, model_factory="hf", text=FILE)``, or a causal LM in memory with ``text`` and ``tokenizer``:
    perplexity and accuracy by token frequency and position, docs/real-text.md). opts: :class:`AccuracyOptions`
    (None: the defaults); overrides: any of its fields, named as ``gradscope accuracy``'s flags, or of
    :class:`SourceOptions`. A task family whose evaluation is its own (gradscope.workflows.families) stores its
    own part and reads the options its evaluation declares; an option no evaluation of the checkpoint's family
    reads is refused.
    """
    where, own = _split(overrides)
    return run_accuracy(source_of(source, **where), with_overrides(AccuracyOptions, opts, own, "accuracy")).to_xarray()


def stability(source: Any, *, opts: StabilityOptions | None = None, **overrides: Any) -> xr.Dataset:
    """Gradient stability (docs/definitions.md §4) as an xarray Dataset with the variables of a stability store
    (write it with ``gradscope.store.write_store``).

    source: a checkpoint file or run directory (or a list of them: every checkpoint, oldest first), a
    :class:`~gradscope.files.checkpoint.Loaded` (not read again), an in-memory model (``gradscope.wrap(...)``),
    or :func:`gradscope.source` (:class:`~gradscope.workflows.sources.Source`).
    opts: :class:`StabilityOptions` (None: the defaults); overrides: any of its fields, each named as its
    ``gradscope stability`` flag (``target_pos`` is ``--target-pos``), or of :class:`SourceOptions`
    (``model_factory="hf", text="t.txt"``: a transformers model on a raw text). ``probes`` may also be a
    :class:`~gradscope.tasks.probes.Probes` or an integer tensor (n, 3, L) instead of a path. A sketched store
    holds ``se_<variable>`` standard errors beside each estimated variable (docs/stores.md).
    """
    given = None
    probes = overrides.get("probes")
    if isinstance(probes, (torch.Tensor, Probes)):
        del overrides["probes"]
        if isinstance(probes, torch.Tensor) and probes.device.type not in ("cpu", "meta"):
            probes = probes.cpu()
        given = validate_probes(probes)
    where, own = _split(overrides)
    return run_stability(source_of(source, **where), with_overrides(StabilityOptions, opts, own, "stability"),
                         probes=given).to_xarray()


def dynamics(source: Any, *, opts: DynamicsOptions | None = None, tokens: torch.Tensor | None = None,
             trajectory_tokens: torch.Tensor | None = None, counts: torch.Tensor | None = None,
             **overrides: Any) -> xr.Dataset:
    """The dynamics view (docs/definitions.md §7) as an xarray Dataset with the variables of a dynamics store.

    source: as in :func:`stability`; a model in memory takes its probe sequences ``tokens`` (n, T), and optionally
    ``trajectory_tokens`` and ``counts`` (:func:`run_dynamics`). opts: :class:`DynamicsOptions` (None: the
    defaults); overrides: any of its fields (parts, sequences, …, target_freq, disturbant, length, corpus), named as
    ``gradscope dynamics``'s flags, or of :class:`SourceOptions`.
    """
    where, own = _split(overrides)
    return run_dynamics(source_of(source, **where), with_overrides(DynamicsOptions, opts, own, "dynamics"),
                        tokens=tokens, trajectory_tokens=trajectory_tokens, counts=counts).to_xarray()

