"""The on-disk corpus (``gradscope corpus prepare``'s output) and its reader.

A corpus is a directory::

    manifest.json          format, settings, the source files' and every written file's sha256,
                           per split: paragraphs and tokens
    tokenizer.model        the SentencePiece model (serialized proto)
    counts.npy             int64 (K,): how often each token id occurs in the train split
    <split>.tokens.npy     int32 (n_tokens,): the split's paragraphs' token ids, concatenated
    <split>.offsets.npy    int64 (n_paragraphs + 1,): paragraph i is tokens[offsets[i]:offsets[i+1]]

for the splits train, valid and test. Token arrays are opened memory-mapped
(``np.load(mmap_mode="r")``), so a WikiText-103-sized corpus costs no memory until read. The
manifest's own sha256 identifies the corpus (a run records it and refuses another corpus).
Everything is validated on opening: a truncated or corrupt file is a one-line :class:`GradscopeError`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.errors import GradscopeError, check

FORMAT = "gradscope-corpus"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.model"
COUNTS = "counts.npy"
SPLITS = ("train", "valid", "test")


def tokens_file(split: str) -> str:
    return f"{split}.tokens.npy"


def offsets_file(split: str) -> str:
    return f"{split}.offsets.npy"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_path(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Split:
    """One split: ``tokens`` (n_tokens,) int32 memory-mapped, ``offsets`` (n + 1,) int64."""

    tokens: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return self.offsets.shape[0] - 1

    @property
    def lengths(self) -> np.ndarray:
        """(n,) tokens per paragraph."""
        return np.diff(self.offsets)

    def paragraph(self, i: int) -> np.ndarray:
        return np.array(self.tokens[self.offsets[i]:self.offsets[i + 1]])  # a copy, not a view of the map


@dataclass(frozen=True)
class Corpus:
    """An opened, validated corpus directory."""

    path: Path
    manifest: dict[str, Any]
    sha256: str  # of manifest.json: the corpus's identity
    vocab_size: int
    counts: np.ndarray  # (K,) int64 train counts per token id
    splits: dict[str, Split]

    def tokenizer_proto(self) -> bytes:
        return (self.path / TOKENIZER).read_bytes()


def _load_array(path: Path, what: str, dtype: type, mmap: bool) -> np.ndarray:
    check(path.is_file(), f"{what}: {path} is missing")
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise GradscopeError(f"{what}: {path} is not a readable .npy file ({str(exc).splitlines()[0][:120]})") from None
    check(isinstance(arr, np.ndarray) and arr.ndim == 1 and arr.dtype == np.dtype(dtype),
          f"{what}: {path} holds {getattr(arr, 'dtype', type(arr).__name__)} of shape {getattr(arr, 'shape', '?')}; "
          f"expected a 1-D {np.dtype(dtype).name} array")
    return arr


def _manifest(path: Path) -> tuple[dict[str, Any], str]:
    file = path / MANIFEST
    check(path.is_dir(), f"corpus: {path} is not a directory (make one with `gradscope corpus prepare`)")
    check(file.is_file(), f"corpus: {path} has no {MANIFEST} (make one with `gradscope corpus prepare`)")
    data = file.read_bytes()
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise GradscopeError(f"corpus: {file} is not valid JSON ({str(exc)[:80]})") from None
    check(isinstance(manifest, dict) and manifest.get("format") == FORMAT,
          f"corpus: {file} is not a gradscope corpus manifest")
    check(manifest.get("format_version") == FORMAT_VERSION,
          f"corpus: {file} has format_version {str(manifest.get('format_version'))[:20]}; this gradscope reads "
          f"version {FORMAT_VERSION}")
    return manifest, sha256_bytes(data)


def _checked_split(path: Path, name: str, info: Any, vocab: int) -> Split:
    what = f"corpus: split {name}"
    check(isinstance(info, dict) and isinstance(info.get("paragraphs"), int) and isinstance(info.get("tokens"), int),
          f"{what}: the manifest lacks its paragraph and token counts")
    tokens = _load_array(path / tokens_file(name), what, np.int32, mmap=True)
    offsets = _load_array(path / offsets_file(name), what, np.int64, mmap=False)
    check(tokens.shape[0] == info["tokens"] and offsets.shape[0] == info["paragraphs"] + 1,
          f"{what}: {tokens.shape[0]} tokens and {offsets.shape[0] - 1} paragraphs on disk, but the manifest says "
          f"{info['tokens']} and {info['paragraphs']}; the corpus is corrupt, prepare it again")
    check(offsets.shape[0] >= 1 and offsets[0] == 0 and offsets[-1] == tokens.shape[0]
          and bool((np.diff(offsets) > 0).all()),
          f"{what}: its paragraph offsets are not increasing from 0 to the token count; the corpus is corrupt")
    if tokens.shape[0]:
        low, high = int(tokens.min()), int(tokens.max())
        check(low >= 0 and high < vocab, f"{what}: token ids {low}…{high} fall outside the vocabulary 0…{vocab - 1}")
    return Split(tokens, offsets)


@functools.lru_cache(maxsize=8)
def _open(path: Path, stamp: tuple[tuple[str, int, int, int], ...]) -> Corpus:
    manifest, sha = _manifest(path)
    vocab = manifest.get("vocab_size")
    check(isinstance(vocab, int) and vocab >= 2, f"corpus: {path / MANIFEST} has no valid vocab_size")
    files = manifest.get("files")
    check(isinstance(files, dict), f"corpus: {path / MANIFEST} lacks its file hashes")
    for small in (TOKENIZER, COUNTS):
        check((path / small).is_file(), f"corpus: {path / small} is missing")
        check(sha256_path(path / small) == files.get(small),
              f"corpus: {path / small} does not match the sha256 in its manifest; the corpus is corrupt")
    counts = _load_array(path / COUNTS, "corpus: counts", np.int64, mmap=False)
    check(counts.shape == (vocab,) and bool((counts >= 0).all()),
          f"corpus: {path / COUNTS} must hold {vocab} non-negative counts")
    split_info = manifest.get("splits")
    check(isinstance(split_info, dict) and set(SPLITS) <= set(split_info),
          f"corpus: {path / MANIFEST} lacks the splits {', '.join(SPLITS)}")
    splits = {name: _checked_split(path, name, split_info[name], vocab) for name in SPLITS}
    check(int(counts.sum()) == splits["train"].tokens.shape[0],
          f"corpus: {path / COUNTS} does not count the train split's tokens; the corpus is corrupt")
    return Corpus(path, manifest, sha, vocab, counts, splits)


def open_corpus(path: str | Path) -> Corpus:
    """Open and validate a corpus directory. Opened corpora are cached per path and the (inode,
    size, modification time) of every file in it, so a changed file is validated afresh. (A file
    truncated in place while a corpus object that maps it is alive cannot be detected: memory maps
    share the file.)"""
    path = Path(path).resolve()
    stamp: list[tuple[str, int, int, int]] = []
    if path.is_dir():
        for p in sorted(path.iterdir()):
            try:
                st = p.stat()
            except OSError:
                continue
            stamp.append((p.name, st.st_ino, st.st_size, st.st_mtime_ns))
    return _open(path, tuple(stamp))


def frequency_ranks(counts: np.ndarray) -> np.ndarray:
    """(K,) rank of every token id when the vocabulary is sorted by train count, most frequent
    first (ties: lower id first). Rank 0 is the most frequent token."""
    order = np.lexsort((np.arange(counts.shape[0]), -counts.astype(np.int64)))
    ranks = np.empty_like(order)
    ranks[order] = np.arange(order.shape[0])
    return ranks


def frequency_bins(counts: np.ndarray, n_bins: int) -> np.ndarray:
    """(K,) bin of every token id: the vocabulary sorted by train count (most frequent first,
    ties by id) and cut into ``n_bins`` quantiles of token types, bin b holding ranks
    [b·K/n_bins, (b+1)·K/n_bins). Bin 0 is the most frequent. n_bins = 2: the frequent and rare
    halves; 10: deciles. Every count in bin b is >= every count in bin b + 1."""
    k = counts.shape[0]
    check(1 <= n_bins <= k, f"frequency bins: got {n_bins}; need 1…{k} (the vocabulary size)")
    return (frequency_ranks(counts) * n_bins) // k
