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

Everything is validated on opening, and every file is checked against its manifest before it is
used: each file's size against its ``.npy`` header (exactly: a truncated or padded file is refused
before it is read) and against the memory budget (:func:`gradscope.guard.check_bytes`) where it is
loaded into memory; every file's sha256 against the manifest (the token files are hashed in one
streaming pass of 16 MiB blocks that also checks the id range and, for train, recounts the ids:
``counts.npy`` must equal that bincount exactly); every split holds at least one paragraph. A
truncated, altered, foreign or oversized file is a one-line :class:`GradscopeError`. The cost (one
read of every file per process; docs/lm.md gives the figures) is paid once per process: the
validated corpus is cached under every file's (inode, size, mtime, ctime), and ctime cannot be set
back by a user, so a file written after validation is validated afresh.
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
from gradscope.fields import MAX_VOCAB  # declared torch-free: corpus prepare --help states it
from gradscope.guard import MAX_RATIO, SMALL, check_bytes

FORMAT = "gradscope-corpus"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.model"
COUNTS = "counts.npy"
SPLITS = ("train", "valid", "test")
MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few kB; a larger one is not read
MAX_NPY_HEADER = 10_000  # numpy's own limit for headers it writes
BLOCK = 1 << 24  # bytes per read when hashing and scanning a token file (a multiple of 4)


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


def _dense_size(path: Path, what: str) -> int:
    """The size of the corpus file ``path``, refused when it is missing or sparse: a file that
    claims far more than the disk holds would take hours to hash, and prepare never writes one."""
    check(path.is_file(), f"{what}: {path} is missing")
    st = path.stat()
    check(st.st_size <= SMALL or st.st_blocks * 512 * MAX_RATIO >= st.st_size,
          f"{what}: {path} is {st.st_size:,} bytes but only {st.st_blocks * 512:,} are on disk (a sparse file); the "
          f"corpus is corrupt")
    return st.st_size


def _npy_layout(path: Path, what: str, dtype: type) -> tuple[int, int]:
    """(byte offset of the data, element count) of the 1-D ``dtype`` .npy file ``path``, from its
    header alone; the file's size must be exactly header + data (a truncated or padded file is
    refused before its data is read)."""
    size = _dense_size(path, what)
    try:
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dt = np.lib.format.read_array_header_1_0(fh, max_header_size=MAX_NPY_HEADER)
            elif version == (2, 0):
                shape, fortran, dt = np.lib.format.read_array_header_2_0(fh, max_header_size=MAX_NPY_HEADER)
            else:
                raise ValueError(f"format version {version[0]}.{version[1]}; expected 1.0 or 2.0")
            offset = fh.tell()
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise GradscopeError(f"{what}: {path} is not a readable .npy file ({str(exc).splitlines()[0][:120]})") from None
    check(isinstance(shape, tuple) and len(shape) == 1 and dt == np.dtype(dtype),
          f"{what}: {path} holds {dt} of shape {shape}; expected a 1-D {np.dtype(dtype).name} array")
    n = int(shape[0])
    data = n * np.dtype(dtype).itemsize
    check(size == offset + data, f"{what}: {path} is {size:,} bytes, but its header declares {n:,} values "
                                 f"({offset + data:,} bytes); the file is truncated or padded, the corpus is corrupt")
    return offset, n


def _load_array(path: Path, what: str, dtype: type, mmap: bool) -> np.ndarray:
    offset, n = _npy_layout(path, what, dtype)
    if not mmap:
        check_bytes(n * np.dtype(dtype).itemsize, f"{what}: {path}", present=path.stat().st_size)
    try:
        arr = np.load(path, mmap_mode="r" if mmap and n else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise GradscopeError(f"{what}: {path} is not a readable .npy file ({str(exc).splitlines()[0][:120]})") from None
    check(isinstance(arr, np.ndarray) and arr.shape == (n,) and arr.dtype == np.dtype(dtype),
          f"{what}: {path} changed while it was read")
    return arr


def _hash_check(path: Path, what: str, files: dict[str, Any]) -> None:
    expected = files.get(path.name)
    check(isinstance(expected, str), f"{what}: the manifest lacks the sha256 of {path.name}; the corpus is corrupt")
    try:
        got = sha256_path(path)
    except OSError as exc:
        raise GradscopeError(f"{what}: cannot read {path} ({exc.strerror})") from None
    check(got == expected, f"{what}: {path} does not match the sha256 in its manifest (altered, or "
                                         f"another corpus's file); the corpus is corrupt, prepare it again")


def _scan_tokens(path: Path, what: str, files: dict[str, Any], vocab: int, count: bool) -> np.ndarray | None:
    """One streaming pass over a token file (its layout already checked): its sha256 against the
    manifest, its ids within the vocabulary, and (``count``) their bincount (K,) int64. Memory:
    one block, never the file."""
    expected = files.get(path.name)
    check(isinstance(expected, str), f"{what}: the manifest lacks the sha256 of {path.name}; the corpus is corrupt")
    offset, _ = _npy_layout(path, what, np.int32)
    h = hashlib.sha256()
    counts = np.zeros(vocab, dtype=np.int64) if count else None
    low, high = 0, 0  # an empty file has no id out of range
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise GradscopeError(f"{what}: cannot read {path} ({exc.strerror})") from None
    with fh:
        h.update(fh.read(offset))
        for block in iter(lambda: fh.read(BLOCK), b""):
            h.update(block)
            ids = np.frombuffer(block[:len(block) - len(block) % 4], dtype=np.int32)
            if not ids.size:
                continue
            low, high = min(low, int(ids.min())), max(high, int(ids.max()))  # low < 0 or high ≥ K: refused below
            if counts is not None and low >= 0 and high < vocab:
                counts += np.bincount(ids, minlength=vocab)
    check(h.hexdigest() == expected, f"{what}: {path} does not match the sha256 in its manifest (altered, or another "
                                     f"corpus's file); the corpus is corrupt, prepare it again")
    check(low >= 0 and high < vocab, f"{what}: token ids {low}…{high} fall outside the vocabulary 0…{vocab - 1}")
    return counts


def _manifest(path: Path) -> tuple[dict[str, Any], str]:
    file = path / MANIFEST
    check(path.is_dir(), f"corpus: {path} is not a directory (make one with `gradscope corpus prepare`)")
    check(file.is_file(), f"corpus: {path} has no {MANIFEST} (make one with `gradscope corpus prepare`)")
    size = file.stat().st_size
    check(size <= MAX_MANIFEST_BYTES, f"corpus: {file} is {size:,} bytes; a manifest is a few kB (at most "
                                      f"{MAX_MANIFEST_BYTES:,}), so this is not one")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise GradscopeError(f"corpus: cannot read {file} ({exc.strerror})") from None
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise GradscopeError(f"corpus: {file} is not valid JSON ({str(exc)[:80]})") from None
    check(isinstance(manifest, dict) and manifest.get("format") == FORMAT,
          f"corpus: {file} is not a gradscope corpus manifest")
    check(manifest.get("format_version") == FORMAT_VERSION,
          f"corpus: {file} has format_version {manifest.get('format_version')!r:.20}; this gradscope reads "
          f"version {FORMAT_VERSION}")
    return manifest, sha256_bytes(data)


def _checked_split(path: Path, name: str, info: Any, vocab: int, files: dict[str, Any], count: bool
                   ) -> tuple[Split, np.ndarray | None]:
    """The split ``name``, every file checked against the manifest; with ``count``, also the
    bincount (K,) of its token ids."""
    what = f"corpus: split {name}"
    check(isinstance(info, dict) and isinstance(info.get("paragraphs"), int) and isinstance(info.get("tokens"), int),
          f"{what}: the manifest lacks its paragraph and token counts")
    _, n_tokens = _npy_layout(path / tokens_file(name), what, np.int32)
    _, n_offsets = _npy_layout(path / offsets_file(name), what, np.int64)
    check(n_tokens == info["tokens"] and n_offsets == info["paragraphs"] + 1,
          f"{what}: {n_tokens} tokens and {n_offsets - 1} paragraphs on disk, but the manifest says "
          f"{info['tokens']} and {info['paragraphs']}; the corpus is corrupt, prepare it again")
    check(n_offsets >= 2, f"{what}: it holds no paragraph; every split needs at least one (prepare the corpus again "
                          f"from more text)")
    _hash_check(path / offsets_file(name), what, files)
    counts = _scan_tokens(path / tokens_file(name), what, files, vocab, count)
    tokens = _load_array(path / tokens_file(name), what, np.int32, mmap=True)
    offsets = _load_array(path / offsets_file(name), what, np.int64, mmap=False)
    check(offsets[0] == 0 and offsets[-1] == tokens.shape[0] and bool((np.diff(offsets) > 0).all()),
          f"{what}: its paragraph offsets are not increasing from 0 to the token count; the corpus is corrupt")
    return Split(tokens, offsets), counts


@functools.lru_cache(maxsize=8)
def _open(path: Path, stamp: tuple[tuple[str, int, int, int, int], ...]) -> Corpus:
    manifest, sha = _manifest(path)
    vocab = manifest.get("vocab_size")
    check(isinstance(vocab, int) and 2 <= vocab <= MAX_VOCAB,
          f"corpus: {path / MANIFEST} has no valid vocab_size (2…{MAX_VOCAB:,})")
    files = manifest.get("files")
    check(isinstance(files, dict), f"corpus: {path / MANIFEST} lacks its file hashes")
    check_bytes(_dense_size(path / TOKENIZER, "corpus"), f"corpus: {path / TOKENIZER}")
    _, n_counts = _npy_layout(path / COUNTS, "corpus: counts", np.int64)  # sizes before anything is read
    check(n_counts == vocab, f"corpus: {path / COUNTS} must hold {vocab} non-negative counts")
    for small in (TOKENIZER, COUNTS):
        _hash_check(path / small, "corpus", files)
    counts = _load_array(path / COUNTS, "corpus: counts", np.int64, mmap=False)
    check(counts.shape == (vocab,) and bool((counts >= 0).all()),
          f"corpus: {path / COUNTS} must hold {vocab} non-negative counts")
    split_info = manifest.get("splits")
    check(isinstance(split_info, dict) and set(SPLITS) <= set(split_info),
          f"corpus: {path / MANIFEST} lacks the splits {', '.join(SPLITS)}")
    splits, recount = {}, None
    for name in SPLITS:
        splits[name], got = _checked_split(path, name, split_info[name], vocab, files, count=name == "train")
        recount = got if got is not None else recount
    if recount is not None and not np.array_equal(counts, recount):
        differ = np.flatnonzero(counts != recount)
        raise GradscopeError(f"corpus: {path / COUNTS} is not the train split's bincount ({differ.size} of {vocab} ids "
                             f"differ, first id {differ[0]}: {counts[differ[0]]} vs {recount[differ[0]]} in "
                             f"{tokens_file('train')}); the corpus is corrupt, prepare it again")
    return Corpus(path, manifest, sha, vocab, counts, splits)


def open_corpus(path: str | Path) -> Corpus:
    """Open and validate a corpus directory (module docstring: every file is hashed and checked
    against the manifest). Opened corpora are cached per path and the (inode, size, modification
    time, change time) of every file in it, so a file changed in any way since (its ctime moves
    even when its mtime is set back) is validated afresh. (A file altered in place while a corpus
    object that maps it is alive cannot be detected: memory maps share the file. A file replaced
    by rename, as gradscope and most tools write, leaves the mapped one intact.)"""
    path = Path(path).resolve()
    stamp: list[tuple[str, int, int, int, int]] = []
    if path.is_dir():
        for p in sorted(path.iterdir()):
            try:
                st = p.stat()
            except OSError:
                continue
            stamp.append((p.name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
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
