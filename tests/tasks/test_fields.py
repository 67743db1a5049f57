"""A task's fields (``tasks.fields.TaskFields``) checked without the task registry: bounds and the rules
between fields are refused in one line naming the field; a task's name is only checked against the
registry by TaskConfig (tests/tasks/test_config.py)."""

from __future__ import annotations

import pytest

from gradscope.config import TaskConfig
from gradscope.errors import GradscopeError
from gradscope.tasks.fields import TaskFields


def test_the_fields_are_checked_without_the_registry() -> None:
    assert TaskFields(name="not-registered").name == "not-registered"  # the registry is TaskConfig's
    with pytest.raises(GradscopeError, match="^task: got 'not-registered'"):
        TaskConfig(name="not-registered")
    for given, field in (({"length": 0}, "length"), ({"vocab_size": 1}, "vocab_size"),
                         ({"distribution": "zipf"}, "distribution"), ({"rarity": 1.0}, "rarity"),
                         ({"old_items": 64}, "old_items"), ({"new_item_share": 0.5}, "new_item_share"),
                         ({"old_items": 8, "new_item_share": 0.5, "distribution": "dual"}, "new_item_share"),
                         ({"corpus": 3}, "corpus")):
        with pytest.raises(GradscopeError, match=f"^{field}: "):
            TaskFields(**given)
    assert TaskFields(old_items=8, new_item_share=0.5).new_item_share == 0.5
