"""The Jacobian structure a core declares: its blocks' kinds, sizes and repeats are checked where they are
declared, and a structure describes itself in one line. What the engines do with a declared structure is
tested in tests/analysis/test_structure.py."""

from __future__ import annotations

import pytest

from gradscope.errors import GradscopeError
from gradscope.models.structure import StateBlock


def test_a_repeated_diagonal_is_declared_checked_and_described() -> None:
    """A diagonal block may say that each value covers ``size`` consecutive entries (a scalar a head); the
    size must divide the width, and only (block-)diagonal blocks take one."""
    from gradscope.models.structure import JacobianStructure, StateBlock

    heads = JacobianStructure((StateBlock("l0/conv", 0, 12, "block_diagonal", 3), StateBlock("l0/ssm", 12, 44, "diagonal", 8),
                               StateBlock("l1/conv", 44, 56, "block_diagonal", 3), StateBlock("l1/ssm", 56, 88, "diagonal", 8)))
    assert heads.describe() == "lower-triangular over 4 blocks: 2 layers × (conv block_diagonal(3), ssm diagonal(×8))"
    with pytest.raises(GradscopeError, match="size 5 does not divide its width 32"):
        StateBlock("ssm", 0, 32, "diagonal", 5)
    with pytest.raises(GradscopeError, match="takes no size"):
        StateBlock("z", 0, 32, "dense", 4)


def test_a_repeat_needs_a_block_diagonal_block_it_tiles() -> None:
    with pytest.raises(GradscopeError, match="repeat 2 needs a block_diagonal"):
        StateBlock("s", 0, 8, "diagonal", 1, 2)
    with pytest.raises(GradscopeError, match="multiple of size × repeat"):
        StateBlock("s", 0, 12, "block_diagonal", 2, 4)
    assert StateBlock("s", 0, 16, "block_diagonal", 2, 4).repeat == 4
