"""The learning-rate schedule: a linear warm-up, then a cosine decay to zero (SPEC §3)."""

from __future__ import annotations

import pytest

from gradscope.train import lr_at


def test_schedule_warmup_then_cosine() -> None:
    assert lr_at(0, 1.0, 10, 110) == pytest.approx(0.1)
    assert lr_at(9, 1.0, 10, 110) == pytest.approx(1.0)
    assert lr_at(10, 1.0, 10, 110) == pytest.approx(1.0)
    assert lr_at(60, 1.0, 10, 110) == pytest.approx(0.5)
    assert lr_at(110, 1.0, 10, 110) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(5, 1.0, 0, 10) == pytest.approx(0.5 * (1 + __import__("math").cos(__import__("math").pi * 0.5)))
