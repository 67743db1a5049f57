"""Held-out test sets and their vectorised exclusion from training data (docs/definitions.md §3).

Rows are identified by their full input row (inputs determine targets for every task). A 64-bit
polynomial hash finds candidate matches with one ``searchsorted``; candidates are then compared
exactly, so exclusion has no false positives. No per-sample Python loop anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from gradscope.errors import GradscopeError, check
from gradscope.tasks.base import Batch, Task
from gradscope.tasks.reverse import Reverse
from gradscope.tasks.vocab import group_size, sample_group

MAX_ROUNDS = 1000
_MULT = 0x9E3779B97F4A7C15  # odd 64-bit multiplier (golden ratio)


def _to_signed(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def row_hash(rows: torch.Tensor) -> torch.Tensor:
    """64-bit polynomial hash of each row: (n, T) long → (n,) long (int64 arithmetic wraps)."""
    length = rows.shape[1]
    powers = [_to_signed(pow(_MULT, t + 1, 1 << 64)) for t in range(length)]
    weights = torch.tensor(powers, dtype=torch.long, device=rows.device)
    return ((rows + 1) * weights).sum(dim=1)


def _first_occurrences(keys: torch.Tensor) -> torch.Tensor:
    """Boolean mask (n,) that is True at the first row of each distinct key."""
    _, inverse = torch.unique(keys, return_inverse=True)
    index = torch.arange(keys.shape[0], device=keys.device)
    first = torch.full((int(inverse.max()) + 1,), keys.shape[0], device=keys.device).scatter_reduce(
        0, inverse, index, reduce="amin")
    return torch.zeros_like(inverse, dtype=torch.bool).index_fill_(0, first, True)


def _cat(a: Batch, b: Batch) -> Batch:
    return Batch(torch.cat([a.inputs, b.inputs]), torch.cat([a.targets, b.targets]))


def sample_unique(draw: Callable[[int], Batch], n: int) -> Batch:
    """``n`` rows with pairwise distinct inputs, topping up with fresh draws."""
    batch = draw(n)
    for _ in range(MAX_ROUNDS):
        keep = _first_occurrences(row_hash(batch.inputs))
        if bool(keep.all()):
            return batch
        batch = _cat(batch.select(keep), draw(n - int(keep.sum())))
    raise GradscopeError(f"heldout_size: could not draw {n} distinct sequences in {MAX_ROUNDS} rounds: the task's "
                         f"token distribution makes that many distinct sequences too unlikely; use fewer held-out "
                         f"sequences")


class Excluder:
    """Membership test against a fixed set of input rows (the held-out data)."""

    def __init__(self, rows: torch.Tensor) -> None:
        hashes = row_hash(rows)
        self.hashes, order = hashes.sort()
        self.rows = rows[order]

    def to(self, device: torch.device | str) -> "Excluder":
        out = Excluder.__new__(Excluder)
        out.hashes, out.rows = self.hashes.to(device), self.rows.to(device)
        return out

    def contains(self, rows: torch.Tensor) -> torch.Tensor:
        """(n, T) → bool (n,): True where the row equals a held-out row."""
        if self.rows.shape[0] == 0 or rows.shape[1] != self.rows.shape[1]:
            return torch.zeros(rows.shape[0], dtype=torch.bool, device=rows.device)
        h = row_hash(rows)
        idx = torch.searchsorted(self.hashes, h).clamp(max=self.hashes.shape[0] - 1)
        candidate = self.hashes[idx] == h
        return candidate & (self.rows[idx] == rows).all(dim=1)


def sample_excluding(task: Task, n: int, gen: torch.Generator, excluder: Excluder) -> Batch:
    """A training batch of ``n`` rows, none equal to a held-out row (colliding rows are redrawn)."""
    batch = task.sample(n, gen)
    for _ in range(MAX_ROUNDS):
        hit = excluder.contains(batch.inputs)
        if not bool(hit.any()):
            return batch
        fresh = task.sample(int(hit.sum()), gen)
        inputs, targets = batch.inputs.clone(), batch.targets.clone()
        inputs[hit], targets[hit] = fresh.inputs, fresh.targets
        batch = Batch(inputs, targets)
    raise GradscopeError(f"heldout_size: could not draw a training batch outside the held-out set in {MAX_ROUNDS} "
                         f"rounds: the held-out sequences cover almost all of the task's probability mass; use fewer "
                         f"held-out sequences")


def supports_grid(task: Task) -> bool:
    """The frequency grid is defined for the dual-frequency runs of a task that reads ``grid_per_cell``
    (reverse: the paper's setting)."""
    return "grid_per_cell" in task.settings and task.cfg.distribution == "dual"


def build_grid(task: Task, gen: torch.Generator) -> torch.Tensor:
    """Dual-frequency grid, raw sequences (2 target group, 2 disturbant group, N, L position, L).

    Sequence [tg, dg, i, p] holds a token of group tg at position p (0-based) and tokens of group
    dg at the other L−1 positions; rows within one (tg, dg, p) cell are distinct.
    """
    cfg = task.cfg
    length, n = cfg.length, cfg.grid_per_cell
    fmt = Reverse(cfg).format
    cells = []
    for tg in (0, 1):
        for dg in (0, 1):
            for p in range(length):
                def draw(k: int, tg: int = tg, dg: int = dg, p: int = p) -> Batch:
                    x = sample_group((k, length), cfg.vocab_size, dg, gen)
                    x[:, p] = sample_group((k,), cfg.vocab_size, tg, gen)
                    return fmt(x)
                cells.append(sample_unique(draw, n).inputs[:, :length])
    return torch.stack(cells).reshape(2, 2, length, n, length).transpose(2, 3).contiguous()


def grid_batch(task: Task, grid: torch.Tensor) -> Batch:
    """Model inputs/targets for every grid sequence, flattened in (tg, dg, N, p) order."""
    return Reverse(task.cfg).format(grid.reshape(-1, grid.shape[-1]))


@dataclass(frozen=True)
class HeldOut:
    """The held-out test data of a run: uniform sample (n, T) and optional raw grid (2, 2, N, L, L)."""

    uniform: Batch
    grid: torch.Tensor | None

    def exclusion_rows(self, task: Task) -> torch.Tensor:
        if task.disjoint_heldout:
            return self.uniform.inputs[:0]
        if self.uniform.inputs.is_floating_point():  # vector tokens: a repeat has probability 0
            return torch.empty(0, 0, dtype=torch.long)
        rows = [self.uniform.inputs]
        if self.grid is not None:
            rows.append(grid_batch(task, self.grid).inputs)
        return torch.cat(rows)


def check_heldout_capacity(task: Task) -> None:
    """Reject held-out sizes that would use up (more than half of) the possible sequences."""
    cfg = task.cfg
    total = task.n_patterns()
    check(cfg.heldout_size <= total // 2,
          f"heldout_size: got {cfg.heldout_size}; this task has only {total} possible sequences, "
          f"and at least half must stay available for training (use at most {total // 2})")
    if supports_grid(task):
        for tg in (0, 1):
            for dg in (0, 1):
                cell = group_size(cfg.vocab_size, tg) * group_size(cfg.vocab_size, dg) ** (cfg.length - 1)
                check(cfg.grid_per_cell <= cell // 2,
                      f"grid_per_cell: got {cfg.grid_per_cell}; a grid cell has only {cell} possible "
                      f"sequences (use at most {cell // 2})")


def build_heldout(task: Task, seed: int) -> HeldOut:
    """Held-out data drawn on the CPU from ``seed`` (so it does not depend on the device), or the
    task's own fixed held-out set."""
    fixed = task.heldout_batch()
    if fixed is not None:
        return HeldOut(fixed, None)
    gen = torch.Generator().manual_seed(seed)
    if task.inputs == "vectors":  # continuous draws: distinct with probability 1, no grid
        return HeldOut(task.sample(task.cfg.heldout_size, gen), None)
    check_heldout_capacity(task)
    uniform = sample_unique(lambda k: task.sample(k, gen), task.cfg.heldout_size)
    grid = build_grid(task, gen) if supports_grid(task) else None
    return HeldOut(uniform, grid)
