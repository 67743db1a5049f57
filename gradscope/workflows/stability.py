"""`gradscope stability`: checkpoints + probe options → per-checkpoint stability results."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import xarray as xr
from torch import nn

from gradscope.analysis.bootstrap import Interval, bootstrap_mean
from gradscope.analysis.stability import PAIRS, probe_stability
from gradscope.config import ModelConfig, RunConfig, TaskConfig
from gradscope.errors import GradscopeError, check
from gradscope.store.records import CheckpointResult
from gradscope.store.stability import probes_from_store, stability_dataset
from gradscope.tasks.probes import GROUPS, Probes, check_probes_fit, frequency_groups, make_probes
from gradscope.train.checkpoint import Loaded, load_checkpoint, resolve_checkpoints
from gradscope.train.device import resolve_device

STABILITY_TASKS = ("reverse", "reverse-variable", "sort")


@dataclass(frozen=True)
class StabilityOptions:
    """How to probe. Empty group tuples mean: the four {frequent, rare}² conditions for a
    dual-frequency checkpoint, all/all for a uniform one."""

    target_groups: tuple[str, ...] = ()
    disturbant_groups: tuple[str, ...] = ()
    position: int = 1
    triplets: int = 64  # per condition
    probes_file: Path | None = None
    seed: int = 0
    method: str = "auto"
    chunk: int = 32
    top_sv: int = 64
    device: str = "auto"
    # a user's own model (``--model-factory``): generated probes need token counts and a length;
    # ``filler`` is the output phase's token (L copies after each probe), None for no output phase
    token_counts: Path | None = None
    length: int | None = None
    filler: int | None = None
    split: float = 0.5


def conditions_for(task: TaskConfig, targets: tuple[str, ...], disturbants: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (target group, disturbant group) conditions to probe, checked against the vocabulary."""
    for name, groups in (("target_groups", targets), ("disturbant_groups", disturbants)):
        for g in groups:
            check(g in GROUPS, f"{name}: got {g!r}; valid values are {', '.join(GROUPS)}")
    dual = task.distribution == "dual"
    if not dual:
        split = [g for g in targets + disturbants if g != "all"]
        check(not split, f"target_groups/disturbant_groups: got {split[0] if split else ''!r}, but this checkpoint "
                         f"was trained on a uniform vocabulary, which has no frequent/rare split; use all")
    default = ("frequent", "rare") if dual else ("all",)
    return list(itertools.product(targets or default, disturbants or default))


def read_probes_file(path: Path) -> Probes:
    """Probe triplets from .npy (int (n, 3, L)), .npz (``tokens`` plus optional ``target_group`` and
    ``disturbant_group`` string arrays) or a previous stability store (.zarr)."""
    path = Path(path)
    if path.is_dir():
        return probes_from_store(path)
    if not path.is_file():
        raise GradscopeError(f"probes_file: {path} does not exist")
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                tokens = loaded["tokens"]
                n = tokens.shape[0]
                tg = loaded["target_group"].tolist() if "target_group" in loaded else ["file"] * n
                dg = loaded["disturbant_group"].tolist() if "disturbant_group" in loaded else ["file"] * n
        else:
            tokens, tg, dg = loaded, ["file"] * loaded.shape[0], ["file"] * loaded.shape[0]
    except (ValueError, OSError, KeyError, IndexError) as exc:
        raise GradscopeError(f"probes_file: cannot read {path} ({type(exc).__name__}: {exc}); expected .npy int64 "
                             f"(n, 3, L) or .npz with 'tokens'") from None
    check(np.issubdtype(tokens.dtype, np.integer), f"probes_file: {path} holds {tokens.dtype}; expected integers")
    check(tokens.ndim == 3 and tokens.shape[1] == 3,
          f"probes_file: {path} has shape {tokens.shape}; expected (n, 3 [base, same-target, same-suffix], L)")
    check(len(tg) == tokens.shape[0] and len(dg) == tokens.shape[0],
          f"probes_file: {path}: one target_group and disturbant_group label per triplet expected")
    return Probes(torch.from_numpy(tokens.astype(np.int64)), tuple(map(str, tg)), tuple(map(str, dg)))


def expand_checkpoints(paths: list[Path]) -> list[Path]:
    """Files as given; run directories expanded to their checkpoints (oldest first)."""
    check(bool(paths), "checkpoint: give at least one checkpoint file or run directory")
    return [c for p in paths for c in resolve_checkpoints(Path(p))]


def build_probes(first: Loaded, opts: StabilityOptions) -> Probes:
    task = first.config.task
    check(task.name in STABILITY_TASKS,
          f"checkpoint: its task is {task.name!r}; stability probes are defined for "
          f"{', '.join(STABILITY_TASKS)} (an input phase followed by query tokens)")
    length = task.length
    check(1 <= opts.position <= length, f"position: got {opts.position}; valid positions are 1…{length}")
    if opts.probes_file is not None:
        probes = read_probes_file(opts.probes_file)
    else:
        conditions = conditions_for(task, opts.target_groups, opts.disturbant_groups)
        probes = make_probes(opts.triplets, length, opts.position, task.vocab_size, conditions, opts.seed)
    check_probes_fit(probes, task.vocab_size, length)
    return probes


@dataclass(frozen=True)
class StabilityRun:
    """A finished stability analysis: every checkpoint's results on the same probes.
    :meth:`to_xarray` gives the stability store's dataset; :meth:`summary` the table's rows."""

    config: dict[str, Any]  # model_config, task_config, train_config (of the first checkpoint)
    probes: Probes
    results: list[CheckpointResult]
    options: StabilityOptions
    command: str = ""
    device: str = "cpu"

    def to_xarray(self) -> xr.Dataset:
        options = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self.options).items()}
        return stability_dataset(self.results, self.probes, options, self.config, self.command, self.device)

    def summary(self, kind: str = "default", seed: int = 0, resamples: int = 10_000) -> list["SummaryRow"]:
        return summarize(self.results, self.probes, kind, seed, resamples)

    @property
    def nan_count(self) -> dict[str, int]:
        """NaN scores (all-zero Jacobians) per score kind, over every checkpoint and pair."""
        return {k: sum(int(r.result.scores[k].isnan().sum()) for r in self.results) for k in self.results[0].result.scores}


def run_stability(paths: list[Path], opts: StabilityOptions,
                  on_start: Callable[[int], None] | None = None,
                  on_progress: Callable[[int], None] | None = None, *, command: str = "",
                  device_label: str | None = None, probes: Probes | None = None) -> StabilityRun:
    """Analyse every checkpoint with the same probes. ``on_start(total triplets)`` then
    ``on_progress(k)`` report progress. Checkpoints are loaded one at a time."""
    files = expand_checkpoints(paths)
    device = resolve_device(opts.device)
    first = load_checkpoint(files[0])
    probes = build_probes(first, opts) if probes is None else probes
    if probes is not None:
        check_probes_fit(probes, first.config.task.vocab_size, first.config.task.length)
    if on_start is not None:
        on_start(len(files) * len(probes))
    results = []
    for path in files:
        loaded = first if path == files[0] else load_checkpoint(path)
        check(loaded.config.task.vocab_size == first.config.task.vocab_size
              and loaded.config.task.length == first.config.task.length,
              f"checkpoint: {path} has a different vocabulary or length than {files[0]}; analyse it separately")
        model = loaded.model.to(device)
        result = probe_stability(model, probes, opts.position, method=opts.method, chunk=opts.chunk,
                                 top_sv=opts.top_sv, on_chunk=on_progress)
        run = path.parent.name if path.parent != Path("") else ""
        results.append(CheckpointResult(path, loaded.iteration, run, result))
        del loaded, model
    return StabilityRun(config_attrs(first.config), probes, results, opts, command,
                        device_label if device_label is not None else str(device))


def config_attrs(config: RunConfig) -> dict[str, Any]:
    """The three config dicts a store records."""
    return {"model_config": dataclasses.asdict(config.model), "task_config": dataclasses.asdict(config.task),
            "train_config": dataclasses.asdict(config.train)}


def model_probes(model: nn.Module, opts: StabilityOptions) -> Probes:
    """Probes for a user's own model: from ``probes_file`` (token ids, (n, 3, T)), or generated
    from ``token_counts`` (counts per token id; groups by :func:`frequency_groups`) and ``length``."""
    vocab = getattr(getattr(model, "inputs", None), "num_embeddings", None)
    if opts.probes_file is not None:
        probes = read_probes_file(opts.probes_file)
    else:
        check(opts.token_counts is not None and opts.length is not None,
              "probes_file: a model of your own needs probes: a file of token ids, or token_counts and length "
              "to generate them")
        counts = read_counts_file(opts.token_counts)
        check(vocab is None or counts.numel() <= vocab,
              f"token_counts: {opts.token_counts} has {counts.numel()} entries; the model's embedding has {vocab} rows")
        pools = frequency_groups(counts, opts.split)
        groups = ("frequent", "rare")
        conditions = list(itertools.product(opts.target_groups or groups, opts.disturbant_groups or groups))
        probes = make_probes(opts.triplets, int(opts.length), opts.position, counts.numel(), conditions, opts.seed,
                             pools=pools)
    if vocab is not None:
        check_probes_fit(probes, int(vocab), probes.length)
    return probes


def read_counts_file(path: Path) -> torch.Tensor:
    """Token counts (K,) from a .npy file, or a text file with one count per line (line i = token id i)."""
    path = Path(path)
    check(path.is_file(), f"token_counts: {path} does not exist")
    try:
        values = np.load(path, allow_pickle=False) if path.suffix == ".npy" else np.loadtxt(path, ndmin=1)
    except (ValueError, OSError) as exc:
        raise GradscopeError(f"token_counts: cannot read {path} ({type(exc).__name__}); expected .npy or one "
                             f"count per line") from None
    check(values.ndim == 1 and np.issubdtype(values.dtype, np.number) and bool(np.isfinite(values).all()),
          f"token_counts: {path} must hold one finite count per token id (shape (K,)); got shape {values.shape}")
    return torch.from_numpy(values.astype(np.float64))


def run_model_stability(model: nn.Module, opts: StabilityOptions, *, probes: Probes | None = None,
                        source: Path | None = None, iteration: int = -1, command: str = "",
                        config: dict[str, Any] | None = None,
                        on_start: Callable[[int], None] | None = None,
                        on_progress: Callable[[int], None] | None = None) -> StabilityRun:
    """Stability of one in-memory model (a user's wrapped model, or a loaded gradscope model).
    The output phase holds ``opts.filler`` (None: no output phase) for a wrapped model, the query
    token for a gradscope model."""
    check(isinstance(model, nn.Module) and hasattr(model, "core") and hasattr(model, "core_inputs"),
          f"model: expected a gradscope model or gradscope.wrap(...); got {type(model).__name__}")
    device = resolve_device(opts.device)
    probes = model_probes(model, opts) if probes is None else probes
    check(1 <= opts.position <= probes.length, f"position: got {opts.position}; valid positions are 1…{probes.length}")
    if on_start is not None:
        on_start(len(probes))
    own_query = getattr(model, "query_token", None)
    output_phase = own_query if own_query is not None and opts.filler is None else opts.filler
    model = model.to(device)
    result = probe_stability(model, probes, opts.position, method=opts.method, chunk=opts.chunk, top_sv=opts.top_sv,
                             on_chunk=on_progress, output_phase=output_phase)
    path = Path(source) if source is not None else Path("<in memory>")
    if config is None:
        own = getattr(model, "config", None)
        described = dataclasses.asdict(own) if isinstance(own, ModelConfig) else \
            model.describe() if hasattr(model, "describe") else {"core": type(model.core).__name__}
        config = {"model_config": described, "task_config": {}, "train_config": {}}
    run = path.parent.name if source is not None else ""
    return StabilityRun(config, probes, [CheckpointResult(path, iteration, run, result)], opts, command, str(device))


@dataclass(frozen=True)
class SummaryRow:
    iteration: int
    run: str
    condition: str
    pair: str
    interval: Interval


def summarize(results: list[CheckpointResult], probes: Probes, kind: str = "default", seed: int = 0,
              resamples: int = 10_000) -> list[SummaryRow]:
    """Mean score with a 95% bootstrap CI over triplets, per checkpoint × condition × pair."""
    check(kind in results[0].result.scores, f"score: got {kind!r}; valid values are "
                                            f"{', '.join(results[0].result.scores)}")
    conditions = probes.conditions
    order = list(dict.fromkeys(conditions))
    rows = []
    for r in results:
        scores = r.result.scores[kind].numpy()  # (2, n)
        for cond in order:
            mask = np.array([c == cond for c in conditions])
            for i, pair in enumerate(PAIRS):
                rows.append(SummaryRow(r.iteration, r.run, cond, pair,
                                       bootstrap_mean(scores[i, mask], seed=seed, resamples=resamples)))
    return rows


def stability(source: Any, probes: Any = None, *, position: int = 1, triplets: int = 64,
              target_groups: tuple[str, ...] = (), disturbant_groups: tuple[str, ...] = (), seed: int = 0,
              method: str = "auto", chunk: int = 32, top_sv: int = 64, device: str = "auto",
              token_counts: str | Path | None = None, length: int | None = None, filler: int | None = None,
              split: float = 0.5) -> xr.Dataset:
    """Gradient stability (SPEC §4) as an xarray Dataset with the variables of a stability store
    (write it with ``ds.to_zarr`` or ``gradscope.store.write_store``).

    source: a checkpoint file or run directory (or a list of them: every checkpoint, oldest first),
    a :class:`~gradscope.train.checkpoint.Loaded`, or an in-memory model (``gradscope.wrap(...)`` or
    ``gradscope.load(...).model``).
    probes: None (generated: ``triplets`` per condition of the checkpoint's task, or, for a wrapped
    model, from ``token_counts`` and ``length``), a path (.npy (n, 3, L) token ids, .npz, or a
    stability store), a :class:`~gradscope.tasks.probes.Probes`, or an integer tensor (n, 3, L).
    position: the target position p (1-based). filler: a wrapped model's output-phase token (L
    copies after each probe; None: no output phase). The other options are those of ``gradscope stability``.
    """
    given = None
    probes_file = None
    if isinstance(probes, (str, Path)):
        probes_file = Path(probes)
    elif isinstance(probes, torch.Tensor):
        check(probes.dim() == 3 and probes.shape[1] == 3 and not probes.is_floating_point(),
              f"probes: expected an integer tensor (n, 3, L); got {probes.dtype} {tuple(probes.shape)}")
        given = Probes(probes.long().cpu(), ("file",) * probes.shape[0], ("file",) * probes.shape[0])
    elif isinstance(probes, Probes):
        given = probes
    else:
        check(probes is None, f"probes: got {type(probes).__name__}; expected a path, a Probes or a tensor (n, 3, L)")
    opts = StabilityOptions(tuple(target_groups), tuple(disturbant_groups), position, triplets, probes_file, seed,
                            method, chunk, top_sv, device, Path(token_counts) if token_counts is not None else None,
                            length, filler, split)
    if isinstance(source, Loaded):
        return run_model_stability(source.model, opts, probes=given if given is not None else build_probes(source, opts),
                                   source=source.path, iteration=source.iteration,
                                   config=config_attrs(source.config)).to_xarray()
    if isinstance(source, nn.Module):
        return run_model_stability(source, opts, probes=given).to_xarray()
    paths = [source] if isinstance(source, (str, Path)) else list(source)
    check(all(isinstance(p, (str, Path)) for p in paths),
          f"source: got {type(source).__name__}; expected checkpoint path(s), a Loaded or a model")
    return run_stability([Path(p) for p in paths], opts, probes=given).to_xarray()
