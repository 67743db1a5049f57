"""Preparing a corpus (``prepare_corpus``): a SentencePiece tokenizer and stored splits that round-trip
and are deterministic, reported by stage; held-out files that repeat the training text are found however
spaced; a split that encodes to nothing and a source too large for memory are refused before anything is
written (exit 2, one `error:` line); killed at random moments (kill -9), it leaves no corpus, and a re-run
gives what an uninterrupted one gives. Opening a prepared corpus is tested in tests/corpus/test_store.py,
the command's option values in tests/cli/test_corpus.py.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.faultkit import spawn, temporaries, wait_for
from tests.helpers.hardening import one_line, succeeded as _ok, write_text
from gradscope.cli.app import app
from gradscope.errors import GradscopeError
from gradscope.corpus import open_corpus
from gradscope.corpus.store import COUNTS, offsets_file, tokens_file
from gradscope.workflows.corpus import CorpusOptions, decode_ids, encode_text, prepare_corpus

from tests.corpus.test_lm import corpus_dir, write_raw  # noqa: F401 - the fixture


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


# ---- what prepare writes ---------------------------------------------------------------------------

def test_sentencepiece_round_trip_and_stored_splits(corpus_dir: Path, tmp_path: Path) -> None:
    corpus = open_corpus(corpus_dir)
    text = "the quick fox jumps over the lazy dog"
    ids = encode_text(corpus, text)
    assert all(0 <= i < 60 for i in ids) and decode_ids(corpus, ids) == text
    # every stored paragraph decodes back to a paragraph of the raw text, and the splits partition them
    raw = write_raw(tmp_path / "again.txt")
    decoded = [decode_ids(corpus, s.paragraph(i).tolist()) for s in corpus.splits.values() for i in range(len(s))]
    assert sorted(decoded) == sorted(raw)
    assert corpus.counts.sum() == corpus.splits["train"].tokens.shape[0]
    assert np.array_equal(corpus.counts, np.bincount(np.asarray(corpus.splits["train"].tokens), minlength=60))
    # deterministic: the same text and settings give the same tokenizer and tokens
    again = prepare_corpus(tmp_path / "again.txt", tmp_path / "c2", opts=CorpusOptions(vocab_size=60, valid=0.1, test=0.1))
    assert again.manifest["tokenizer"]["sha256"] == corpus.manifest["tokenizer"]["sha256"]
    assert np.array_equal(np.asarray(again.splits["test"].tokens), np.asarray(corpus.splits["test"].tokens))


def test_corpus_preparation_reports_its_stages(tmp_path: Path) -> None:
    write_raw(tmp_path / "raw.txt")
    stages: list[str] = []
    prepare_corpus(tmp_path / "raw.txt", tmp_path / "c", opts=CorpusOptions(vocab_size=40, valid=0.1, test=0.1),
                   on_stage=stages.append)
    assert [s.split()[0] for s in stages] == ["reading", "training", "encoding", "writing"]


def test_held_out_splits_that_repeat_the_training_text_are_found_however_spaced(tmp_path: Path, runner) -> None:
    """A valid or test file holding the training paragraphs with CRLF line ends, trailing spaces, extra blank
    lines or in another order is refused in one line (it was accepted: only byte-identical files were); a few
    shared paragraphs are a warning line with their share, and the corpus is written."""
    write_raw(tmp_path / "raw.txt")
    train = [p for p in (tmp_path / "raw.txt").read_text().splitlines() if p.strip() and not p.strip().startswith("=")]
    own = [f"held out paragraph number {i} with words of its own kind" for i in range(40)]
    (tmp_path / "test.txt").write_text("\n".join(own[20:]) + "\n")
    variants = {"crlf": "\r\n".join(train) + "\r\n", "trailing": "\n".join(p + "   " for p in train) + "\n",
                "blank lines": "\n\n\n".join(train) + "\n", "reordered": "\n".join(reversed(train)) + "\n",
                "re-spaced": "\n".join("  ".join(p.split()) for p in train) + "\n"}
    for name, text in variants.items():
        (tmp_path / "valid.txt").write_bytes(text.encode("utf-8"))
        r = runner.invoke(app, ["corpus", "prepare", str(tmp_path / "raw.txt"), "-o", str(tmp_path / "c"), "-q",
                                "--valid-file", str(tmp_path / "valid.txt"), "--test-file", str(tmp_path / "test.txt"),
                                "--vocab", "40"])
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, (name, r.stderr)
        assert "--valid-file" in r.stderr and "100%" in r.stderr and "train split" in r.stderr, (name, r.stderr)
        assert not (tmp_path / "c").exists()
    (tmp_path / "valid.txt").write_text("\n".join([*own[:20], train[0] + " ", train[1]]) + "\n")
    r = runner.invoke(app, ["corpus", "prepare", str(tmp_path / "raw.txt"), "-o", str(tmp_path / "c"), "-q",
                            "--valid-file", str(tmp_path / "valid.txt"), "--test-file", str(tmp_path / "test.txt"),
                            "--vocab", "40"])
    assert r.exit_code == 0, r.stderr
    assert r.stderr.startswith("warning: --valid-file") or "warning:" in r.stderr
    assert "2 of its 22 paragraphs (9.1%)" in r.stderr and (tmp_path / "c").is_dir()


def test_prepare_corpus_takes_opts_or_its_fields_by_name(tmp_path: Path) -> None:
    """The analysis functions' shape: ``opts`` (CorpusOptions) and/or its fields as keywords; an unknown name or
    options of another kind are one line, before anything is read or made."""
    write_text(tmp_path / "raw.txt", 60, 0)
    with pytest.raises(GradscopeError, match="^vocab: not an option of prepare_corpus; its options are vocab_size, "):
        prepare_corpus(tmp_path / "raw.txt", tmp_path / "c", vocab=40)
    with pytest.raises(GradscopeError, match=r"^opts: got dict; expected CorpusOptions\(…\)$"):
        prepare_corpus(tmp_path / "raw.txt", tmp_path / "c", opts={"vocab_size": 40})  # type: ignore[arg-type]
    with pytest.raises(GradscopeError, match="^valid_file/test_file: give both, or neither$"):
        prepare_corpus(tmp_path / "raw.txt", tmp_path / "c", opts=CorpusOptions(vocab_size=40), valid_file="v.txt")
    assert not (tmp_path / "c").exists()
    by_name = prepare_corpus(tmp_path / "raw.txt", tmp_path / "a", vocab_size=40, split_seed=3)
    by_opts = prepare_corpus(tmp_path / "raw.txt", tmp_path / "b", opts=CorpusOptions(vocab_size=40, split_seed=3))
    assert by_name.manifest["settings"] == by_opts.manifest["settings"] == {**CorpusOptions(vocab_size=40,
                                                                                            split_seed=3).recorded()}
    assert (tmp_path / "a" / COUNTS).read_bytes() == (tmp_path / "b" / COUNTS).read_bytes()
