"""A prepared corpus as it is opened (``corpus.store.open_corpus``): verified as its manifest promises.
Damage tried: truncated, padded (oversized), sparse, altered in place at the same length (shuffled ids),
a foreign file (another corpus's), counts that no longer match the train split, a manifest that claims
huge sizes or states its format version as a string, an oversized .npy header, an empty split. Each is a
one-line error with exit status 2 wherever the corpus is opened (`accuracy`, `train`), never a number.
Corpora here are a few kB of text (vocabulary 40 pieces), runs a few iterations of a hidden size 8 LSTM;
preparing a corpus is tested in tests/workflows/test_corpus.py. Also: the frequency bins of a corpus's counts.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.hardening import TRAIN, corpus_base, one_line
from gradscope.cli.app import app
from gradscope.corpus import frequency_bins, open_corpus
from gradscope.corpus.store import COUNTS, MANIFEST, offsets_file, sha256_path, tokens_file
from gradscope.errors import GradscopeError


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus ``a``, a second corpus ``b`` of other text with the same vocabulary size, and a
    3-iteration lm run on ``a``."""
    return corpus_base(tmp_path_factory)


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


# ---- every file against the manifest -----------------------------------------------------------

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


def test_a_manifest_format_version_as_a_string_is_named_as_one(tmp_path: Path) -> None:
    """A manifest whose format_version is the string "1" was refused as "has format_version 1; this
    gradscope reads version 1"."""
    from gradscope.corpus.store import _manifest

    d = tmp_path / "c"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"format": "gradscope-corpus", "format_version": "1"}))
    with pytest.raises(GradscopeError, match=r"format_version '1'; this gradscope reads version 1"):
        _manifest(d)


# ---- frequency bins ----------------------------------------------------------------------------------

def test_frequency_bins_are_the_quantiles_of_the_counts() -> None:
    rng = np.random.default_rng(3)
    k, n_bins = 200, 10
    counts = rng.permutation(np.arange(k) * 7 + 1)  # distinct counts
    bins = frequency_bins(counts, n_bins)
    m = k // n_bins
    for b in range(n_bins):
        hi = np.quantile(counts, (k - 1 - b * m) / (k - 1), method="nearest")
        lo = np.quantile(counts, (k - (b + 1) * m) / (k - 1), method="nearest")
        assert set(np.flatnonzero(bins == b)) == set(np.flatnonzero((counts >= lo) & (counts <= hi)))
    # with ties: equal-size bins, every count of bin b >= every count of bin b + 1, ties broken by id
    counts = rng.integers(0, 5, k)
    bins = frequency_bins(counts, 2)
    assert (bins == 0).sum() == (bins == 1).sum() == k // 2
    assert counts[bins == 0].min() >= counts[bins == 1].max()
    tie = counts[bins == 0].min()
    if tie == counts[bins == 1].max():
        assert np.flatnonzero((bins == 0) & (counts == tie)).max() < np.flatnonzero((bins == 1) & (counts == tie)).min()
