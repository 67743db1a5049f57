"""Tasks, vocabularies and held-out sets (SPEC §3)."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from gradscope.config import TaskConfig
from gradscope.errors import GradscopeError
from gradscope.tasks import (IGNORE, Excluder, build_heldout, grid_batch, make_task, sample_excluding, sample_tokens)
from gradscope.tasks.copy import Copy
from gradscope.tasks.delayed_sum import DelayedSum
from gradscope.tasks.predecessor import Predecessor
from gradscope.tasks.reverse import Reverse
from gradscope.tasks.reverse_variable import ReverseVariable
from gradscope.tasks.sort import Sort

I = IGNORE


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("rarity", [0.125, 0.25, 0.5])
def test_dual_frequency_rarity_and_within_group_uniformity(rarity: float) -> None:
    tokens = sample_tokens((400_000,), 16, "dual", rarity, gen(1))
    rare = tokens >= 8
    # binomial sd is < 0.0008 here; 0.004 is > 5 sd
    assert abs(rare.float().mean().item() - rarity) < 0.004
    for group in (tokens[~rare], tokens[rare]):
        counts = torch.bincount(group - group.min(), minlength=8).numpy()
        assert stats.chisquare(counts).pvalue > 1e-4


def test_uniform_vocabulary_covers_all_tokens_evenly() -> None:
    counts = torch.bincount(sample_tokens((200_000,), 10, "uniform", 0.1, gen(2)), minlength=10).numpy()
    assert stats.chisquare(counts).pvalue > 1e-4


def test_reverse_targets_hand_checked() -> None:
    t = Reverse(TaskConfig(vocab_size=5, length=3))
    b = t.format(torch.tensor([[1, 2, 3]]))
    assert b.inputs.tolist() == [[1, 2, 3, 5, 5, 5]]
    assert b.targets.tolist() == [[I, I, I, 3, 2, 1]]


def test_reverse_variable_targets_hand_checked() -> None:
    t = ReverseVariable(TaskConfig(name="reverse-variable", vocab_size=5, length=4, min_length=2))
    b = t.format(torch.tensor([[1, 2, 3, 4], [4, 3, 2, 1]]), torch.tensor([2, 4]))
    assert b.inputs.tolist() == [[1, 2, 5, 5, 5, 5, 5, 5], [4, 3, 2, 1, 5, 5, 5, 5]]
    assert b.targets.tolist() == [[I, I, 2, 1, I, I, I, I], [I, I, I, I, 1, 2, 3, 4]]
    assert t.lengths_of(b).tolist() == [2, 4]


def test_sort_targets_hand_checked() -> None:
    b = Sort(TaskConfig(name="sort", vocab_size=5, length=4)).format(torch.tensor([[3, 0, 3, 1]]))
    assert b.targets.tolist() == [[I, I, I, I, 0, 1, 3, 3]]


def test_delayed_sum_targets_hand_checked() -> None:
    t = DelayedSum(TaskConfig(name="delayed-sum", vocab_size=5, length=3))
    b = t.format(torch.tensor([[1, 2, 4]]), torch.tensor([[3, 3, 0]]))
    # target_t = (x_{L+1−t} + y_t) mod 5: (4+3)%5=2, (2+3)%5=0, (1+0)%5=1
    assert b.inputs.tolist() == [[1, 2, 4, 3, 3, 0]]
    assert b.targets.tolist() == [[I, I, I, 2, 0, 1]]


def test_predecessor_targets_hand_checked_and_non_repeating() -> None:
    t = Predecessor(TaskConfig(name="predecessor", vocab_size=9, length=4))
    b = t.format(torch.tensor([[7, 1, 5, 2]]), torch.tensor([3]))  # x_3 = 5 → predecessor x_2 = 1
    assert b.inputs.tolist() == [[7, 1, 5, 2, 5]]
    assert b.targets.tolist() == [[I, I, I, I, 1]]
    for dist in ("uniform", "dual"):
        s = Predecessor(TaskConfig(name="predecessor", vocab_size=9, length=6, distribution=dist)).sample(500, gen(3))
        x = s.inputs[:, :6]
        assert all(len(set(row)) == 6 for row in x.tolist())
        answer = s.targets[:, -1]
        q = (x == s.inputs[:, 6:7]).float().argmax(1)  # 0-based position of the cue
        assert bool((q >= 1).all()) and torch.equal(answer, x[torch.arange(500), q - 1])


def test_copy_targets_hand_checked() -> None:
    t = Copy(TaskConfig(name="copy", vocab_size=4, length=2, hold_min=1, hold_max=3))
    b = t.format(torch.tensor([[3, 1], [0, 2]]), torch.tensor([1, 3]))
    blank, delim, q = 4, 5, 6
    # T = 2L + hold_max + 1 = 8
    assert b.inputs.tolist() == [[3, 1, blank, delim, q, q, q, q], [0, 2, blank, blank, blank, delim, q, q]]
    assert b.targets.tolist() == [[I, I, I, I, 3, 1, I, I], [I, I, I, I, I, I, 0, 2]]
    assert t.num_classes == 6


@pytest.mark.parametrize("name", ["reverse", "reverse-variable", "sort", "delayed-sum", "predecessor", "copy"])
def test_sampling_is_seeded_and_well_formed(name: str) -> None:
    cfg = TaskConfig(name=name, vocab_size=10, length=6, min_length=3, hold_min=2, hold_max=5, distribution="dual")
    task = make_task(cfg)
    a, b = task.sample(64, gen(9)), task.sample(64, gen(9))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert a.inputs.shape == (64, task.total_len)
    assert int(a.inputs.max()) <= task.query and int(a.inputs.min()) >= 0
    scored = a.targets[a.targets != IGNORE]
    assert scored.numel() > 0 and int(scored.max()) < task.num_classes


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


def test_config_errors_name_the_argument() -> None:
    with pytest.raises(GradscopeError, match="vocab_size.*predecessor"):
        TaskConfig(name="predecessor", vocab_size=4, length=8)
    with pytest.raises(GradscopeError, match="length: got 0"):
        TaskConfig(length=0)
    with pytest.raises(GradscopeError, match="task: got 'nope'"):
        TaskConfig(name="nope")


def test_grid_only_for_dual_reverse() -> None:
    from gradscope.tasks import supports_grid
    assert supports_grid(make_task(TaskConfig(distribution="dual")))
    assert not supports_grid(make_task(TaskConfig(name="sort", distribution="dual")))
    assert not supports_grid(make_task(TaskConfig(distribution="uniform")))
