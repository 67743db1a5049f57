"""Building a run config from a preset and options (``gradscope.presets.build_config``): an option the task
does not read is refused, never recorded; options of zero are kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.hardening import refused_one_line as refused
from gradscope.cli.app import app
from gradscope.errors import GradscopeError


def test_vocab_on_the_continuous_task_is_refused_not_recorded(tmp_path: Path, runner) -> None:  # noqa: ANN001
    """`train --task reverse-continuous --dim 4 --vocab 5` trained (its width is --dim) and recorded
    vocab_size 5 in config.json: an option accepted, ignored and recorded."""
    out = tmp_path / "r"
    result = runner.invoke(app, ["train", "--task", "reverse-continuous", "--dim", "4", "--vocab-size", "5", "--iterations",
                                 "2", "--checkpoint-every", "2", "-o", str(out), "-q"])
    refused(result, "--vocab-size", "--dim")
    assert not out.exists()
    from gradscope.presets import build_config

    with pytest.raises(GradscopeError, match="vocab_size"):
        build_config("tiny", {"task": "reverse-continuous", "dim": 4, "vocab_size": 5})
    assert build_config("tiny", {"task": "reverse-continuous", "dim": 4}).model.vocab_size == 4


def test_options_of_zero_are_kept() -> None:
    from gradscope.presets import build_config
    assert build_config("tiny", {"beta1": 0.0}).train.betas[0] == 0.0
    assert build_config("tiny", {"clip": 0.0}).train.clip == 0.0
