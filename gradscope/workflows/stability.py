"""`gradscope stability`: checkpoints + probe options → per-checkpoint stability results."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from gradscope.analysis.bootstrap import Interval, bootstrap_mean
from gradscope.analysis.stability import PAIRS, StabilityResult, probe_stability
from gradscope.config import TaskConfig
from gradscope.errors import GradscopeError, check
from gradscope.tasks.probes import GROUPS, Probes, check_probes_fit, make_probes
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


@dataclass(frozen=True)
class CheckpointResult:
    path: Path
    iteration: int
    run: str
    result: StabilityResult


def conditions_for(task: TaskConfig, targets: tuple[str, ...], disturbants: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (target group, disturbant group) conditions to probe, checked against the vocabulary."""
    for name, groups in (("--target-freq", targets), ("--disturbant", disturbants)):
        for g in groups:
            check(g in GROUPS, f"{name}: got {g!r}; valid values are {', '.join(GROUPS)}")
    dual = task.distribution == "dual"
    if not dual:
        split = [g for g in targets + disturbants if g != "all"]
        check(not split, f"--target-freq/--disturbant: got {split[0] if split else ''!r}, but this checkpoint "
                         f"was trained on a uniform vocabulary, which has no frequent/rare split; use all")
    default = ("frequent", "rare") if dual else ("all",)
    return list(itertools.product(targets or default, disturbants or default))


def read_probes_file(path: Path) -> Probes:
    """Probe triplets from .npy (int (n, 3, L)), .npz (``tokens`` plus optional ``target_group`` and
    ``disturbant_group`` string arrays) or a previous stability store (.zarr)."""
    path = Path(path)
    if path.is_dir():
        from gradscope.store.stability import probes_from_store
        return probes_from_store(path)
    if not path.is_file():
        raise GradscopeError(f"--probes: {path} does not exist")
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
        raise GradscopeError(f"--probes: cannot read {path} ({type(exc).__name__}: {exc}); expected .npy int64 "
                             f"(n, 3, L) or .npz with 'tokens'") from None
    check(np.issubdtype(tokens.dtype, np.integer), f"--probes: {path} holds {tokens.dtype}; expected integers")
    check(tokens.ndim == 3 and tokens.shape[1] == 3,
          f"--probes: {path} has shape {tokens.shape}; expected (n, 3 [base, same-target, same-suffix], L)")
    check(len(tg) == tokens.shape[0] and len(dg) == tokens.shape[0],
          f"--probes: {path}: one target_group and disturbant_group label per triplet expected")
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
    check(1 <= opts.position <= length, f"--target-pos: got {opts.position}; valid positions are 1…{length}")
    if opts.probes_file is not None:
        probes = read_probes_file(opts.probes_file)
    else:
        conditions = conditions_for(task, opts.target_groups, opts.disturbant_groups)
        probes = make_probes(opts.triplets, length, opts.position, task.vocab_size, conditions, opts.seed)
    check_probes_fit(probes, task.vocab_size, length)
    return probes


def run_stability(paths: list[Path], opts: StabilityOptions,
                  on_start: Callable[[int], None] | None = None,
                  on_progress: Callable[[int], None] | None = None) -> tuple[list[Loaded], Probes, list[CheckpointResult]]:
    """Analyse every checkpoint with the same probes. ``on_start(total triplets)`` then
    ``on_progress(k)`` report progress. Returns (loaded checkpoints, probes, results)."""
    files = expand_checkpoints(paths)
    device = resolve_device(opts.device)
    first = load_checkpoint(files[0])
    probes = build_probes(first, opts)
    if on_start is not None:
        on_start(len(files) * len(probes))
    loaded_all, results = [], []
    for path in files:
        loaded = first if path == files[0] else load_checkpoint(path)
        check(loaded.config.task.vocab_size == first.config.task.vocab_size
              and loaded.config.task.length == first.config.task.length,
              f"checkpoint: {path} has a different vocabulary or length than {files[0]}; analyse it separately")
        model = loaded.model.to(device)
        result = probe_stability(model, probes, opts.position, method=opts.method, chunk=opts.chunk,
                                 top_sv=opts.top_sv, on_chunk=on_progress)
        loaded.model.to("cpu")
        run = path.parent.name if path.parent != Path("") else ""
        results.append(CheckpointResult(path, loaded.iteration, run, result))
        loaded_all.append(loaded)
    return loaded_all, probes, results


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
    check(kind in results[0].result.scores, f"--score: got {kind!r}; valid values are "
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
