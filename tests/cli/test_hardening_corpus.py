"""`gradscope corpus prepare` refuses what would give an empty split or blow up memory, and empty or huge
option values, in one `error:` line (exit 2) leaving nothing behind; killed at random moments (kill -9),
it leaves no corpus, and a re-run gives what an uninterrupted one gives. Opening a prepared corpus is
tested in tests/corpus/test_store.py.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.faultkit import spawn, temporaries, wait_for
from tests.helpers.hardening import one_line, write_text
from tests.helpers.hardening import succeeded as _ok
from gradscope.cli.app import app
from gradscope.corpus import open_corpus
from gradscope.corpus.store import COUNTS, offsets_file, tokens_file


# ---- no empty split, sizes before reading ------------------------------------------------------

def test_a_split_that_encodes_to_nothing_is_refused_by_prepare(tmp_path: Path, runner) -> None:
    write_text(tmp_path / "train.txt", 60, 0)
    write_text(tmp_path / "test.txt", 20, 1)  # its own text: split files holding the same text are refused first
    (tmp_path / "ctrl.txt").write_text("\x01\x02\x03\n\x04\x05\n", encoding="utf-8")  # paragraphs of control chars
    r = runner.invoke(app, ["corpus", "prepare", str(tmp_path / "train.txt"), "--valid-file", str(tmp_path / "ctrl.txt"),
                            "--test-file", str(tmp_path / "test.txt"), "--vocab", "40", "-q", "-o",
                            str(tmp_path / "c")])
    one_line(r, "encode to no token")
    assert not (tmp_path / "c").exists() and not temporaries(tmp_path)


def test_a_huge_sparse_source_is_refused_before_it_is_read(tmp_path: Path, runner, monkeypatch) -> None:
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", str(64 << 20))
    with open(tmp_path / "huge.txt", "wb") as fh:
        fh.truncate(1 << 40)  # 1 TB of holes
    tic = time.monotonic()
    r = runner.invoke(app, ["corpus", "prepare", str(tmp_path / "huge.txt"), "-q", "-o", str(tmp_path / "c")])
    one_line(r, "of memory")
    assert "1,099,511,627,776 bytes of text" in r.stderr and "budget is 67.1 MB" in r.stderr  # the size and the budget
    assert time.monotonic() - tic < 10
    # the split files count too
    write_text(tmp_path / "small.txt", 30, 0)
    r = runner.invoke(app, ["corpus", "prepare", str(tmp_path / "small.txt"), "--valid-file", str(tmp_path / "huge.txt"),
                            "--test-file", str(tmp_path / "small.txt"), "-q", "-o", str(tmp_path / "c")])
    one_line(r, "of memory")


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


# ---- kill -9 during prepare -----------------------------------------------------------------------

def _tree(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def slow_saves(marker: Path):
    """A child ``setup``: each corpus array is written half, then (its name in ``marker``) a pause,
    then the rest; the same bytes as ever."""
    def setup() -> None:
        import io

        import gradscope.workflows.corpus as wc

        def save(path: Path, arr: np.ndarray) -> None:
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            data = buf.getvalue()
            with open(path, "wb") as fh:
                fh.write(data[:len(data) // 2])
                fh.flush()
                marker.write_text(path.name)
                time.sleep(0.05)
                fh.write(data[len(data) // 2:])
        wc._save = save
    return setup


def test_prepare_killed_at_random_moments_leaves_no_corpus_then_a_rerun_gives_the_uninterrupted_one(
        tmp_path: Path) -> None:
    import gradscope.workflows.corpus  # noqa: F401 - imported before forking, so children start warm
    import sentencepiece  # noqa: F401
    raw = write_text(tmp_path / "raw.txt", 20000, 3)  # ~1.3 MB: ~0.4 s of work to interrupt
    args = ["corpus", "prepare", raw, "--vocab", "60", "-q", "-o", "out"]
    logs, marker = tmp_path / "logs", tmp_path / "writing"
    (tmp_path / "ref").mkdir()
    tic = time.monotonic()
    _ok(spawn(args, cwd=tmp_path / "ref", logs=logs).outcome(120), "uninterrupted prepare")
    seconds = time.monotonic() - tic
    rng = random.Random(0)
    kills = []

    def after_kill(child, what: str) -> None:
        child.kill()
        if child.status == -9:
            kills.append(what)
        if (tmp_path / "out").exists():  # it got as far as publishing: then the corpus is whole
            assert _tree(tmp_path / "out") == _tree(tmp_path / "ref" / "out"), f"{what}: a partial corpus"
            open_corpus(tmp_path / "out")
            shutil.rmtree(tmp_path / "out")

    for _ in range(2):  # at random moments
        child = spawn(args, cwd=tmp_path, logs=logs)
        delay = rng.uniform(0.0, seconds / 2)
        time.sleep(delay)
        after_kill(child, f"{delay:.2f} s in")
    for name in (COUNTS, tokens_file("train"), offsets_file("test")):  # inside the write of a file
        child = spawn(args, cwd=tmp_path, logs=logs, setup=slow_saves(marker))
        wait_for(lambda: marker.is_file() and marker.read_text() == name, child, what=f"writing {name}")
        after_kill(child, f"writing {name}")
        marker.unlink(missing_ok=True)
    assert sum(k.startswith("writing") for k in kills) == 3, f"a kill inside a write missed: {kills}"
    assert temporaries(tmp_path), "the kills left no temporary: the re-run's clean-up is not tested"
    _ok(spawn(args, cwd=tmp_path, logs=logs).outcome(120), "prepare after kills")
    assert _tree(tmp_path / "out") == _tree(tmp_path / "ref" / "out")
    assert not temporaries(tmp_path), f"temporaries left: {temporaries(tmp_path)}"
