"""`gradscope corpus prepare`: empty or huge option values are one `error:` line (exit 2) that leaves
nothing behind, or are accepted and give a complete corpus.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.faultkit import temporaries
from tests.helpers.hardening import one_line, write_text
from gradscope.cli.app import app
from gradscope.corpus import open_corpus


EMPTY_AND_HUGE = [
    (["--vocab", "0"], "vocab"), (["--vocab", str(2**64)], "vocab"), (["--vocab", "-1"], "vocab"),
    (["--vocab", str(2**24)], "vocab"), (["--vocab", str(2**24), "--model-type", "char"], "pieces, so pass vocab"),
    (["--vocab", "4"], "vocab"),
    (["--model-type", ""], "model_type"), (["--model-type", "x" * 10_000], "model_type"),
    (["--character-coverage", "nan"], "character_coverage"), (["--character-coverage", "1e309"], "character_coverage"),
    (["--character-coverage", "0"], "character_coverage"),
    (["--valid", "0"], "valid"), (["--valid", "nan"], "valid"), (["--valid", "1e309"], "valid"),
    (["--valid", "1e-300"], "valid"), (["--test", "0.99"], "test"), (["--test", "-0.0"], "test"),
    (["--split-seed", "-1"], "split_seed"), (["--split-seed", str(2**200)], ""),
    (["--valid-file", ""], "valid_file"), (["--valid-file", "", "--test-file", ""], ""),
    (["--valid-file", "/dev/zero", "--test-file", "/dev/null"], "not a file"),
    (["-o", ""], "out"), (["-o", "/dev/null/x"], "out"), (["-o", "x" * 5000], "out"),
    (["-o", "a/" + "x" * 300 + "/b"], "out"),
    (["--valid-file", "y" * 5000, "--test-file", "y" * 5000], "valid_file"),
]


@pytest.mark.parametrize("args,words", EMPTY_AND_HUGE, ids=[" ".join(a)[:40] for a, _ in EMPTY_AND_HUGE])
def test_empty_and_huge_prepare_options_are_one_line_errors_or_work(tmp_path: Path, runner, args: list[str],
                                                                     words: str, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative outputs ("a/…") land here, and a refused run must leave none behind
    write_text(tmp_path / "t.txt", 60, 0)
    full = ["corpus", "prepare", str(tmp_path / "t.txt"), "--vocab", "40", "-q", "-o", str(tmp_path / "c"), *args]
    r = runner.invoke(app, full, catch_exceptions=True)
    if r.exit_code == 0:
        open_corpus(tmp_path / "c")  # accepted: then the corpus is complete and valid
        assert not words, f"{args} was accepted: {r.stdout}"
    else:
        one_line(r, words)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"], "a refused prepare left something behind"
    assert not temporaries(tmp_path)
