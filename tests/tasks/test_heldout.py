"""Held-out sets (``tasks.heldout``): a set the task's distribution cannot fill, or one that leaves no
training data, is a user error naming heldout_size; training draws exclude exactly the held-out rows
and the dual-frequency grid, whose structure is checked cell by cell."""

from __future__ import annotations

import pytest
import torch

from gradscope.config import TaskConfig
from gradscope.errors import GradscopeError
from gradscope.tasks import Excluder, build_heldout, grid_batch, make_task, sample_excluding
from gradscope.tasks.reverse import Reverse

from tests.tasks.test_base import gen


def test_held_out_sets_that_cannot_be_drawn_are_a_user_error() -> None:
    """A held-out set that the task's distribution cannot fill (or that leaves no training data)
    is a one-line error naming heldout_size, not a RuntimeError."""
    from gradscope.tasks import Batch, Excluder, make_task, sample_excluding, sample_unique
    same_row = lambda k: Batch(torch.zeros(k, 4, dtype=torch.long), torch.zeros(k, 4, dtype=torch.long))  # noqa: E731
    with pytest.raises(GradscopeError, match="heldout_size"):
        sample_unique(same_row, 2)
    task = make_task(TaskConfig(vocab_size=2, length=1, heldout_size=1))
    every_row = torch.tensor([[0, 2], [1, 2]])
    with pytest.raises(GradscopeError, match="heldout_size"):
        sample_excluding(task, 4, torch.Generator().manual_seed(0), Excluder(every_row))


def test_heldout_exclusion_rejects_exactly_the_heldout_rows() -> None:
    """A 64-pattern space with 32 held out: training draws none of them, and all 32 others."""
    task = Reverse(TaskConfig(vocab_size=2, length=6, heldout_size=32))
    held = build_heldout(task, seed=0)
    held_rows = {tuple(r) for r in held.uniform.inputs.tolist()}
    assert len(held_rows) == 32
    excluder = Excluder(held.exclusion_rows(task))
    g = gen(5)
    seen = set()
    for _ in range(20):
        batch = sample_excluding(task, 500, g, excluder)
        rows = {tuple(r) for r in batch.inputs.tolist()}
        assert not rows & held_rows
        seen |= rows
    assert len(seen) == 32  # nothing outside the held-out set is wrongly rejected


def test_excluder_contains_is_exact() -> None:
    rows = torch.randint(0, 50, (1000, 12), generator=gen(6))
    ex = Excluder(rows[:500])
    hit = ex.contains(rows)
    expected = torch.tensor([tuple(r) in {tuple(x) for x in rows[:500].tolist()} for r in rows.tolist()])
    assert torch.equal(hit, expected)


def test_grid_structure() -> None:
    cfg = TaskConfig(vocab_size=10, length=5, distribution="dual", grid_per_cell=3, heldout_size=16)
    task = Reverse(cfg)
    grid = build_heldout(task, seed=1).grid
    assert grid is not None and grid.shape == (2, 2, 3, 5, 5)
    for tg in range(2):
        for dg in range(2):
            for i in range(3):
                for p in range(5):
                    row = grid[tg, dg, i, p].tolist()
                    assert (row[p] >= 5) == bool(tg), (tg, dg, i, p, row)
                    assert all((tok >= 5) == bool(dg) for j, tok in enumerate(row) if j != p)
    batch = grid_batch(task, grid)
    assert batch.inputs.shape == (2 * 2 * 3 * 5, 10)
    assert torch.equal(batch.targets[:, 5:], batch.inputs[:, :5].flip(1))


def test_grid_is_excluded_from_training() -> None:
    task = Reverse(TaskConfig(vocab_size=4, length=3, distribution="dual", grid_per_cell=1, heldout_size=4))
    held = build_heldout(task, seed=2)
    grid_rows = {tuple(r) for r in grid_batch(task, held.grid).inputs.tolist()}
    batch = sample_excluding(task, 20_000, gen(3), Excluder(held.exclusion_rows(task)))
    assert not {tuple(r) for r in batch.inputs.tolist()} & grid_rows


def test_heldout_capacity_is_checked() -> None:
    with pytest.raises(GradscopeError, match="heldout_size"):
        build_heldout(Reverse(TaskConfig(vocab_size=2, length=4, heldout_size=9)), seed=0)
    with pytest.raises(GradscopeError, match="grid_per_cell"):
        build_heldout(Reverse(TaskConfig(vocab_size=4, length=2, distribution="dual", grid_per_cell=3,
                                         heldout_size=2)), seed=0)


def test_grid_only_for_dual_reverse() -> None:
    from gradscope.tasks import supports_grid
    assert supports_grid(make_task(TaskConfig(distribution="dual")))
    assert not supports_grid(make_task(TaskConfig(name="sort", distribution="dual")))
    assert not supports_grid(make_task(TaskConfig(distribution="uniform")))
