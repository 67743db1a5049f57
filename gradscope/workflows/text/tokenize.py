"""Raw text in, a model's own tokenizer.

A UTF-8 text is split into paragraphs exactly as ``gradscope corpus prepare`` splits it
(:func:`gradscope.corpus.text.paragraphs`: one paragraph per non-empty line, WikiText headings
dropped), read line by line, and each paragraph is encoded with the tokenizer saved in the model's
directory (:func:`gradscope.models.adapters.tokenizer.load_tokenizer`: local files only, no remote
code), without special tokens. The result is cached beside the text, in
``.gradscope-cache/<name>.<key>.tokens.npz`` (:mod:`gradscope.files.tokens`), keyed by the text's
sha256, the tokenizer files' sha256 and the transformers/tokenizers versions, and verified on use; a
text folder that is not writable caches under ``$GRADSCOPE_CACHE_DIR`` (default
``~/.cache/gradscope/tokens``).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.corpus.text import iter_paragraphs
from gradscope.errors import GradscopeError, GradscopeWarning, check
from gradscope.files.io import sha256_file
from gradscope.files.tokens import read_token_cache, write_token_cache
from gradscope.guard import check_bytes
from gradscope.models.adapters.tokenizer import encode, load_tokenizer, start_token, tokenizer_files, tokenizer_sha256

BYTES_PER_TEXT_BYTE = 8  # int32 ids (at most ~1 per byte for the tokenizers in use) while gathered, then joined
BATCH = 4096  # paragraphs per call of the tokenizer


class TokenCacheWarning(GradscopeWarning):
    """The token cache could not be used or written; the text was tokenised afresh."""


@dataclass(frozen=True)
class TokenizedText:
    """A text's paragraphs as token ids: paragraph i is ``tokens[offsets[i]:offsets[i + 1]]``."""

    path: Path
    sha256: str
    tokenizer_sha256: str
    tokens: np.ndarray  # (N,) int32
    offsets: np.ndarray  # (n + 1,) int64
    cache: Path | None  # the cache file (None: not cached)
    from_cache: bool
    start: int | None = None  # the tokenizer's start token (BOS, else EOS, else None)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    def counts(self, vocab: int) -> np.ndarray:
        """(vocab,) int64 count of every id in the text."""
        check(not self.tokens.size or int(self.tokens.max()) < vocab,
              f"tokenizer: {self.path} encodes to id {int(self.tokens.max()) if self.tokens.size else 0}, beyond the "
              f"model's vocabulary of {vocab}; the tokenizer is not this model's")
        return np.bincount(self.tokens, minlength=vocab).astype(np.int64)


def _versions() -> dict[str, str]:
    out = {}
    for name in ("transformers", "tokenizers"):
        try:
            out[name] = str(__import__(name).__version__)
        except ImportError:
            out[name] = ""
    return out


def cache_path(text: Path, key: dict[str, Any], cache_dir: Path | None = None) -> Path:
    """Where the tokens of ``text`` under ``key`` are cached: beside the text, else in ``cache_dir``
    (default ``$GRADSCOPE_CACHE_DIR`` or ``~/.cache/gradscope/tokens``)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    name = f"{text.name}.{digest}.tokens.npz"
    if cache_dir is None and os.access(text.parent, os.W_OK | os.X_OK):
        return text.parent / ".gradscope-cache" / name
    folder = Path(cache_dir) if cache_dir is not None else Path(
        os.environ.get("GRADSCOPE_CACHE_DIR") or Path.home() / ".cache" / "gradscope" / "tokens")
    return folder / f"{hashlib.sha256(str(text.resolve()).encode()).hexdigest()[:8]}-{name}"


def _encode_file(path: Path, tok: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    parts: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    total = 0
    for batch in iter_paragraphs(path, what, BATCH):
        ids = encode(tok, batch, "tokenizer")
        n = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter((i for x in ids for i in x), dtype=np.int64, count=int(n.sum()))
        check(not flat.size or (int(flat.min()) >= 0 and int(flat.max()) < 2**31),
              f"tokenizer: it encodes {path} to ids outside 0…2^31 − 1")
        total += flat.size
        check_bytes(8 * total, f"{what}: {path}'s tokens")
        parts.append(flat.astype(np.int32))
        lengths.append(n)
    check(bool(lengths), f"{what}: {path} holds no paragraph (only blank lines or headings)")
    n = np.concatenate(lengths)
    check(total > 0, f"{what}: {path} encodes to no token with this tokenizer ({n.size} paragraph(s), every one empty "
                     f"after encoding); is it the model's tokenizer?")
    offsets = np.zeros(n.size + 1, dtype=np.int64)
    np.cumsum(n, out=offsets[1:])
    return np.concatenate(parts), offsets


def tokenize_text(text: str | Path, tokenizer: str | Path, *, what: str = "text", cache: bool = True,
                  cache_dir: str | Path | None = None) -> TokenizedText:
    """The paragraphs of ``text`` encoded with the tokenizer saved in folder ``tokenizer`` (see the
    module docstring), read from the cache when it verifies, else tokenised and cached. ``what``:
    the parameter the text came from (text, counts_text), named in errors."""
    path = Path(text)
    check(path.is_file(), f"{what}: {path} is not a file")
    size = path.stat().st_size
    check_bytes(BYTES_PER_TEXT_BYTE * size, f"{what}: tokenising {path} ({size} bytes)")
    files = tokenizer_files(Path(tokenizer))
    key = {"text_sha256": sha256_file(path), "tokenizer_sha256": tokenizer_sha256(files), **_versions()}
    tok = load_tokenizer(Path(tokenizer))
    start = start_token(tok)
    where = cache_path(path, key, None if cache_dir is None else Path(cache_dir)) if cache else None
    if where is not None:
        found = read_token_cache(where, key)
        if found is not None:
            return TokenizedText(path, key["text_sha256"], key["tokenizer_sha256"], *found, where, True, start)
        if where.exists():
            warnings.warn(TokenCacheWarning(f"token cache: {where} does not verify (altered, or another gradscope's); "
                                            f"tokenising {path} again"), stacklevel=2)
    tokens, offsets = _encode_file(path, tok, what)
    if where is not None:
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
            write_token_cache(where, tokens, offsets, key)
        except (OSError, GradscopeError) as exc:
            warnings.warn(TokenCacheWarning(f"token cache: cannot write {where} ({exc}); the tokens are not cached"),
                          stacklevel=2)
            where = None
    return TokenizedText(path, key["text_sha256"], key["tokenizer_sha256"], tokens, offsets, where, False, start)
