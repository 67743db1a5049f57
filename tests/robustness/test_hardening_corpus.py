"""Hardening of prepared corpora and the lm task (issue #36, part 2): a corpus is verified as its
manifest promises, `corpus prepare` refuses what would give an empty split or blow up memory, and
kill -9 during `corpus prepare` or lm training leaves nothing half-written (a re-run or resume
gives what an uninterrupted run gives).

Damage tried on a prepared corpus: truncated, padded (oversized), sparse, altered in place at the
same length (shuffled ids), a foreign file (another corpus's), counts that no longer match the
train split, a manifest that claims huge sizes, an oversized .npy header. Each must be a one-line
error with exit status 2 wherever the corpus is opened (`accuracy`, `train`), never a number.
Corpora here are a few kB of text (vocabulary 40 pieces), runs a few iterations of a hidden size 8 LSTM.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.faultkit import spawn, temporaries, wait_for
from tests.helpers.fuzzkit import Outcome
from gradscope.cli.app import app
from gradscope.corpus import open_corpus
from gradscope.corpus.store import COUNTS, MANIFEST, offsets_file, sha256_path, tokens_file
from gradscope.errors import GradscopeError
from gradscope.workflows.corpus import CorpusOptions, prepare_corpus

WORDS = ("the cat sat on a mat and dog ran to big red house with blue door under tree old man saw small bird in "
         "green field quick fox jumps over lazy river bank").split()
TRAIN = ["train", "--task", "lm", "--core", "lstm", "--embed-size", "8", "--hidden-size", "8", "--max-length", "12",
         "--batch-size", "4", "--warmup", "1", "--heldout-size", "4", "--threads", "1", "-q"]


def write_text(path: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(WORDS) + 1)
    lines = [" = Title = ", ""] + [" ".join(rng.choice(WORDS, int(rng.integers(4, 30)), p=p / p.sum()))
                                  for _ in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def one_line(r, words: str = "") -> None:
    """Exit 2 with one `error:` line holding ``words``; no traceback."""
    assert r.exit_code == 2, f"exit {r.exit_code}: {r.stdout[-400:]} {r.stderr[-1500:]} {r.exception!r}"
    assert r.stderr.startswith("error:") and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    # the CLI names its flags (--model-type), the library its parameters (model_type)
    assert words in r.stderr or (words.isidentifier() and f"--{words.replace('_', '-')}" in r.stderr), r.stderr


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus ``a``, a second corpus ``b`` of other text with the same vocabulary size, and a
    3-iteration lm run on ``a``."""
    from typer.testing import CliRunner
    root = tmp_path_factory.mktemp("hcorpus")
    settings = CorpusOptions(vocab_size=40, valid=0.15, test=0.15)
    prepare_corpus(write_text(root / "a.txt", 160, 0), root / "a", settings)
    prepare_corpus(write_text(root / "b.txt", 160, 1), root / "b", settings)
    r = CliRunner().invoke(app, [*TRAIN, "--corpus", str(root / "a"), "--iterations", "3", "--checkpoint-every", "3",
                                 "-o", str(root / "run")])
    assert r.exit_code == 0, r.output
    return root


def damaged(base: Path, tmp_path: Path) -> Path:
    out = tmp_path / "c"
    shutil.copytree(base / "a", out)
    return out


def rewrite_manifest(corpus: Path, change) -> None:
    """Change the manifest, then record every file's true sha256 in it (a crafted, self-consistent
    corpus: only the checks beyond the hashes can refuse it)."""
    m = json.loads((corpus / MANIFEST).read_text())
    change(m)
    m["files"] = {p.name: sha256_path(p) for p in sorted(corpus.iterdir()) if p.name != MANIFEST}
    (corpus / MANIFEST).write_text(json.dumps(m))


def shuffle_tokens(path: Path) -> None:
    arr = np.load(path)
    rng = np.random.default_rng(0)
    shuffled = arr.copy()
    while np.array_equal(shuffled, arr):
        rng.shuffle(shuffled)
    np.save(path, shuffled)


# ---- 1. every file against the manifest --------------------------------------------------------

def _truncate(c: Path, b: Path) -> None:
    p = c / tokens_file("test")
    p.write_bytes(p.read_bytes()[:-4])


def _pad(c: Path, b: Path) -> None:
    with open(c / tokens_file("test"), "ab") as fh:
        fh.write(b"\0" * 64)


def _shuffle(c: Path, b: Path) -> None:
    shuffle_tokens(c / tokens_file("test"))


def _shuffle_train(c: Path, b: Path) -> None:  # same ids, same counts: only the hash can tell
    shuffle_tokens(c / tokens_file("train"))


def _foreign(c: Path, b: Path) -> None:  # another corpus's test split, resized to this manifest's counts
    tokens, offsets = np.load(b / tokens_file("test")), np.load(c / offsets_file("test"))
    n = int(offsets[-1])
    np.save(c / tokens_file("test"), np.resize(tokens, n).astype(np.int32))


def _foreign_offsets(c: Path, b: Path) -> None:  # paragraph boundaries moved, every size unchanged
    offsets = np.load(c / offsets_file("test"))
    offsets[1:-1] = np.maximum(offsets[1:-1] - 1, offsets[:-2] + 1)
    np.save(c / offsets_file("test"), offsets)


def _sparse(c: Path, b: Path) -> None:
    with open(c / tokens_file("valid"), "r+b") as fh:
        fh.truncate(1 << 36)


def _big_header(c: Path, b: Path) -> None:
    arr = np.load(c / tokens_file("test"))
    header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % arr.size
    header = header + " " * (200_000 - len(header)) + "\n"
    (c / tokens_file("test")).write_bytes(b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header.encode()
                                           + arr.tobytes())


DAMAGE = {"truncated": (_truncate, "truncated"), "padded": (_pad, "truncated or padded"),
          "altered": (_shuffle, "sha256"), "altered-train": (_shuffle_train, "sha256"),
          "foreign-tokens": (_foreign, "sha256"), "foreign-offsets": (_foreign_offsets, "sha256"),
          "sparse": (_sparse, "sparse"), "huge-header": (_big_header, "not a readable .npy")}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_corpus_file_is_a_one_line_error_never_a_number(base: Path, tmp_path: Path, runner, case: str
                                                                   ) -> None:
    corpus = damaged(base, tmp_path)
    damage, words = DAMAGE[case]
    damage(corpus, base / "b")
    with pytest.raises(GradscopeError, match=words.replace("(", r"\(")):
        open_corpus(corpus)
    one_line(runner.invoke(app, ["accuracy", str(base / "run"), "--corpus", str(corpus), "-o",
                                 str(tmp_path / "acc.zarr"), "-q"]), words)
    assert not (tmp_path / "acc.zarr").exists()


def test_counts_must_equal_the_train_splits_bincount(base: Path, tmp_path: Path, runner) -> None:
    corpus = damaged(base, tmp_path)
    counts = np.load(corpus / COUNTS)
    a, b = np.flatnonzero(counts)[:2]
    counts[a] += 1
    counts[b] -= 1  # the total is unchanged: only a recount can tell
    np.save(corpus / COUNTS, counts)
    rewrite_manifest(corpus, lambda m: None)
    one_line(runner.invoke(app, [*TRAIN, "--corpus", str(corpus), "--iterations", "1", "-o", str(tmp_path / "r")]),
             "bincount")
    assert not (tmp_path / "r").exists()


def test_a_manifest_that_claims_huge_sizes_is_refused_before_anything_is_read(base: Path, tmp_path: Path,
                                                                               monkeypatch) -> None:
    corpus = damaged(base, tmp_path / "m")
    with open(corpus / MANIFEST, "r+b") as fh:  # a sparse 64 GB manifest: not read
        fh.truncate(1 << 36)
    with pytest.raises(GradscopeError, match="a manifest is a few kB"):
        open_corpus(corpus)
    corpus = damaged(base, tmp_path / "t")
    rewrite_manifest(corpus, lambda m: m["splits"]["train"].update(tokens=10**15, paragraphs=10**14))
    with pytest.raises(GradscopeError, match="but the manifest says"):
        open_corpus(corpus)
    corpus = damaged(base, tmp_path / "v")
    rewrite_manifest(corpus, lambda m: m.update(vocab_size=2**40))
    with pytest.raises(GradscopeError, match="vocab_size"):
        open_corpus(corpus)
    # counts.npy (loaded into memory) is checked against the memory budget before it is read
    corpus = damaged(base, tmp_path / "b")
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", "100")
    with pytest.raises(GradscopeError, match="of memory"):
        open_corpus(corpus)


def test_an_intact_corpus_is_cached_but_a_rewrite_with_its_old_mtime_is_seen(base: Path, tmp_path: Path) -> None:
    corpus = damaged(base, tmp_path)
    assert open_corpus(corpus) is open_corpus(corpus)  # validated once per process
    p = corpus / tokens_file("test")
    st = p.stat()
    arr = np.load(p)
    with open(p, "r+b") as fh:  # altered in place (same inode, same size), mtime set back
        fh.seek(p.stat().st_size - arr.nbytes)
        fh.write(np.roll(arr, 1).tobytes())
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    with pytest.raises(GradscopeError, match="sha256"):
        open_corpus(corpus)


# ---- 2. prepare: no empty split, sizes before reading ---------------------------------------------

def test_a_split_that_encodes_to_nothing_is_refused_by_prepare(tmp_path: Path, runner) -> None:
    write_text(tmp_path / "train.txt", 60, 0)
    write_text(tmp_path / "test.txt", 20, 1)  # its own text: split files holding the same text are refused first
    (tmp_path / "ctrl.txt").write_text("\x01\x02\x03\n\x04\x05\n", encoding="utf-8")  # paragraphs of control chars
    r = runner.invoke(app, ["corpus", "prepare", str(tmp_path / "train.txt"), "--valid-file", str(tmp_path / "ctrl.txt"),
                            "--test-file", str(tmp_path / "test.txt"), "--vocab", "40", "-q", "-o",
                            str(tmp_path / "c")])
    one_line(r, "encode to no token")
    assert not (tmp_path / "c").exists() and not temporaries(tmp_path)


def test_a_corpus_with_an_empty_split_is_refused_where_it_is_opened(base: Path, tmp_path: Path, runner) -> None:
    """A corpus made before prepare refused empty splits: training on it is refused (before, it
    trained, and `accuracy` then failed on a bare assert)."""
    corpus = damaged(base, tmp_path)
    np.save(corpus / tokens_file("test"), np.zeros(0, dtype=np.int32))
    np.save(corpus / offsets_file("test"), np.zeros(1, dtype=np.int64))
    rewrite_manifest(corpus, lambda m: m["splits"]["test"].update(tokens=0, paragraphs=0))
    one_line(runner.invoke(app, [*TRAIN, "--corpus", str(corpus), "--iterations", "1", "-o", str(tmp_path / "r")]),
             "no paragraph")
    assert not (tmp_path / "r").exists()


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


# ---- 3. kill -9 during prepare and during lm training ---------------------------------------------

def _ok(o: Outcome, what: str) -> None:
    assert o.rc == 0, f"{what}: exit {o.rc}: {o.err[-1500:]}"


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


def test_lm_training_killed_then_resumed_equals_the_uninterrupted_run(base: Path, tmp_path: Path) -> None:
    from tests.robustness.test_faults import run_differences, warm
    warm()
    train = [*TRAIN, "--corpus", base / "a", "--iterations", "24", "--checkpoint-every", "4", "--log-every", "2",
             "--seed", "5"]
    logs = tmp_path / "logs"
    (tmp_path / "ref").mkdir()
    _ok(spawn([*train, "-o", "run"], cwd=tmp_path / "ref", logs=logs).outcome(180), "uninterrupted lm run")
    run = tmp_path / "run"
    child = spawn([*train, "-o", "run"], cwd=tmp_path, logs=logs)
    deadline = time.monotonic() + 120
    while not list(run.glob("step-0000008.pt")) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    child.kill()
    assert child.status == -9, "the lm run ended before the kill"
    for _ in range(2):  # resumes, killed a random moment later
        child = spawn(["train", "--resume", "run", "-q"], cwd=tmp_path, logs=logs)
        time.sleep(random.Random(len(list(run.glob("step-*.pt")))).uniform(0.2, 1.0))
        child.kill()
    _ok(spawn(["train", "--resume", "run", "-q"], cwd=tmp_path, logs=logs).outcome(180), "final resume")
    problems = run_differences(tmp_path / "ref" / "run", run)
    assert not problems, "\n".join(problems[:12])
    assert not temporaries(run)
