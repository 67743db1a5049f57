"""The task's configuration: its errors name the argument (a setting of one task, a bound, an unknown
task)."""

from __future__ import annotations

import pytest

from gradscope.config import TaskConfig
from gradscope.errors import GradscopeError


def test_config_errors_name_the_argument() -> None:
    with pytest.raises(GradscopeError, match="vocab_size.*predecessor"):
        TaskConfig(name="predecessor", vocab_size=4, length=8)
    with pytest.raises(GradscopeError, match="length: got 0"):
        TaskConfig(length=0)
    with pytest.raises(GradscopeError, match="task: got 'nope'"):
        TaskConfig(name="nope")
