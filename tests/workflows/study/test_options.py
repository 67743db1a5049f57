"""The study's options are checked before anything trains: bad extension or lm-probe settings are
one-line errors, and no study directory is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradscope.cli.app import app


@pytest.mark.parametrize("args, message", [
    (["--models", "gru", "--extend-to", "10"], "--extend-to: got 10; it must exceed the study's vocabulary"),
    (["--models", "gru", "--extend-to", "99999999999"], "--extend-to: got 99999999999; it must be at most"),
    (["--models", "gru", "--extend-to", "128", "--extend-iterations", "0"], "--extend-iterations: got 0"),
    (["--models", "gru", "--extend-iterations", "5"], "give extend_to"),  # the parameter, as from Python
    (["--study", "lm", "--extend-to", "2000"], "(study reverse)"),
    (["--study", "lm", "--models", "gru"], "--models: got 'gru'; the lm study trains the paper's LSTM only"),
    (["--study", "lm", "--probe-length", "1"], "--probe-length: got 1"),
    (["--study", "lm", "--target-pos", "40"], "--target-pos: got 40; valid positions are 1…31"),
])
def test_reproduce_checks_the_extension_before_training(runner, tmp_path: Path, args: list[str], message: str) -> None:
    """Bad extension or lm-probe settings are one-line errors before anything trains or a corpus is
    built (not after the study's hours)."""
    r = runner.invoke(app, ["reproduce", "--seeds", "1", "-q", "-o", str(tmp_path / "st"), *args])
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "st").exists()
