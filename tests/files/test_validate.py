"""The validation layer's size check: a checkpoint whose config is huge, with weights that match it, is
refused against the memory budget before anything is allocated, and so are real weights given less
memory than they need. The checkpoints come from tests/files/conftest.py; every other malformed field is
in tests/files/test_checkpoint.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gradscope
from tests.helpers.hardening import raw
from gradscope.errors import GradscopeError


def test_a_huge_config_is_refused_before_anything_is_allocated(sources: dict[str, Path], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """hidden = 28000 with weights that match it: refused for its size against the memory budget."""
    import resource
    path = tmp_path / "big.pt"
    c = raw(sources["gru"])
    c["config"]["model"]["hidden_size"] = 28000
    torch.save(c, path)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(GradscopeError):
        gradscope.load(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000  # kB: nothing like 9 GB
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", "1000")  # the real weights, but less memory than they need
    with pytest.raises(GradscopeError, match="memory"):
        gradscope.load(sources["gru"])
