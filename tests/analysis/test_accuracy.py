"""Accuracy: per token, per sequence, per position, per length and on the dual-frequency grid (SPEC §5).

References are independent: hand-made arrays with exact fractions.
"""

from __future__ import annotations

import pytest
import torch

from gradscope.analysis.accuracy import (accuracy_by_length, binned_counts, binned_grid_accuracy, grid_counts,
                                         grid_target_accuracy, length_counts, position_accuracy, position_bins,
                                         position_counts, ratio, sequence_accuracy, token_accuracy)
from gradscope.config import TaskConfig
from gradscope.errors import GradscopeError
from gradscope.tasks.base import IGNORE
from gradscope.tasks.reverse import Reverse
from gradscope.tasks.reverse_variable import ReverseVariable

X = IGNORE

# --- accuracy on hand-made arrays ---------------------------------------------------------------

PREDS = torch.tensor([[7, 7, 1, 2, 3],
                      [7, 7, 1, 0, 3]])
TARGETS = torch.tensor([[X, X, 1, 2, 3],
                        [X, X, 1, 2, 0]])


def test_token_position_sequence_accuracy_exact_fractions() -> None:
    assert token_accuracy(PREDS, TARGETS).item() == pytest.approx(4 / 6)
    assert sequence_accuracy(PREDS, TARGETS).item() == 0.5
    pos = position_accuracy(PREDS, TARGETS)
    assert torch.isnan(pos[:2]).all()
    assert pos[2:].tolist() == [1.0, 0.5, 0.5]
    correct, scored = position_counts(PREDS, TARGETS)
    assert correct.tolist() == [0, 0, 2, 1, 1] and scored.tolist() == [0, 0, 2, 2, 2]
    assert torch.equal(ratio(correct, scored).isnan(), pos.isnan())
    assert ratio(correct, scored)[2:].tolist() == [1.0, 0.5, 0.5]


def test_accuracy_by_length_hand_made() -> None:
    # row 0: length 1, right; row 1: length 2, one of two right; row 2: length 2, both right
    preds = torch.tensor([[0, 5, 0, 0], [0, 0, 3, 0], [0, 0, 1, 2]])
    targets = torch.tensor([[X, 5, X, X], [X, X, 3, 4], [X, X, 1, 2]])
    assert accuracy_by_length(preds, targets) == {1: 1.0, 2: 0.75}
    assert accuracy_by_length(preds, targets, kind="sequence") == {1: 1.0, 2: 0.5}
    # explicit lengths win over the scored count
    assert accuracy_by_length(preds, targets, torch.tensor([4, 2, 4])) == {2: 0.5, 4: 1.0}
    correct, total = length_counts(preds, targets)
    assert correct.tolist() == [0, 1, 3] and total.tolist() == [0, 1, 4]
    with pytest.raises(GradscopeError, match="kind"):
        accuracy_by_length(preds, targets, kind="row")


def test_accuracy_by_length_on_reverse_variable_rows() -> None:
    task = ReverseVariable(TaskConfig(name="reverse-variable", vocab_size=8, length=6, min_length=3))
    lengths = torch.tensor([3, 3, 5, 6])
    batch = task.format(torch.arange(24).reshape(4, 6) % 8, lengths)
    preds = batch.targets.clone()
    preds[0, 3] += 1  # the first output of the first length-3 row is wrong: 2 of 3 right
    preds[3, 11] += 1  # last output of the length-6 row
    assert torch.equal(ReverseVariable.lengths_of(batch), lengths)
    got = accuracy_by_length(preds, batch.targets, lengths)
    assert got == pytest.approx({3: 5 / 6, 5: 1.0, 6: 5 / 6})


# --- the dual-frequency grid --------------------------------------------------------------------

# --- the dual-frequency grid --------------------------------------------------------------------

def grid_with_one_wrong_cell(length: int, n: int, p0: int, vocab: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """A raw grid (2, 2, N, L, L) and predictions (2, 2, N, L, 2L) right at every target recall
    except target position p0 of group (tg, dg) = (1, 0); every other output is wrong on purpose,
    so reading the wrong output index cannot look right."""
    gen = torch.Generator().manual_seed(0)
    grid = torch.randint(0, vocab, (2, 2, n, length, length), generator=gen)
    flat = Reverse(TaskConfig(vocab_size=vocab, length=length)).format(grid.reshape(-1, length)).targets
    preds = flat.reshape(2, 2, n, length, 2 * length).clone()
    preds = torch.where(preds == IGNORE, torch.randint(0, vocab, preds.shape, generator=gen), (preds + 1) % vocab)
    p = torch.arange(length)
    preds[..., p, 2 * length - 1 - p] = grid[..., p, p]  # the target recalls, right
    preds[1, 0, :, p0, 2 * length - 1 - p0] = (grid[1, 0, :, p0, p0] + 1) % vocab
    return grid, preds


def test_grid_indexing_exactly_one_cell_wrong() -> None:
    length, n, p0 = 12, 3, 4
    grid, preds = grid_with_one_wrong_cell(length, n, p0)
    expected = torch.ones(2, 2, length)
    expected[1, 0, p0] = 0.0
    acc = grid_target_accuracy(preds, grid)
    assert acc.shape == (2, 2, length)
    assert torch.equal(acc, expected)
    correct, total = grid_counts(preds, grid)
    assert torch.equal(total, torch.full((2, 2, length), n))
    assert torch.equal(correct, (expected * n).long())
    # update/compute: counts of chunks along N add up to the whole
    c1, t1 = grid_counts(preds[:, :, :1], grid[:, :, :1])
    c2, t2 = grid_counts(preds[:, :, 1:], grid[:, :, 1:])
    assert torch.equal(c1 + c2, correct) and torch.equal(t1 + t2, total)


def test_grid_binning_of_the_wrong_cell() -> None:
    length, n, p0 = 12, 3, 4  # 1-based position 5 lies in the second quarter, positions 4–6
    grid, preds = grid_with_one_wrong_cell(length, n, p0)
    binned = binned_grid_accuracy(grid_target_accuracy(preds, grid))
    expected = torch.ones(2, 2, 4)
    expected[1, 0, 1] = (3 - 1) / 3
    assert binned.shape == (2, 2, 4)
    torch.testing.assert_close(binned, expected)
    c, t = binned_counts(*grid_counts(preds, grid))
    assert t.tolist() == [[[9] * 4] * 2] * 2
    torch.testing.assert_close(ratio(c, t), expected)
    # explicit edges: one bin 1–4, one bin 5–12 holding the wrong position (7 of 8 right)
    two = binned_grid_accuracy(grid_target_accuracy(preds, grid), [0, 4, 12])
    assert two[1, 0].tolist() == pytest.approx([1.0, 7 / 8]) and (two[0] == 1).all() and (two[1, 1] == 1).all()


def test_grid_shape_errors() -> None:
    grid, preds = grid_with_one_wrong_cell(4, 2, 0)
    with pytest.raises(GradscopeError, match="preds"):
        grid_counts(preds.reshape(-1, 8), grid)


def test_position_bins() -> None:
    assert position_bins(64) == [(1, 16), (17, 32), (33, 48), (49, 64)]
    assert position_bins(64, [0, 16, 32, 48, 64]) == position_bins(64, 4)
    assert position_bins(10, 3) == [(1, 4), (5, 7), (8, 10)]
    assert position_bins(64, [0, 8, 64]) == [(1, 8), (9, 64)]
    assert position_bins(5, 5) == [(i, i) for i in range(1, 6)]
    for bad in (0, 65, [0], [0, 70], [8, 8, 16]):
        with pytest.raises(GradscopeError, match="bins"):
            position_bins(64, bad)
