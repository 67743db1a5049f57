"""The token cache of a raw text: a text tokenised with a model's tokenizer, kept beside
the text so the next command need not tokenise it again.

One ``.npz`` file (no pickles): ``tokens`` (int32, every paragraph's ids concatenated), ``offsets``
(int64, n + 1: paragraph i is tokens[offsets[i]:offsets[i + 1]]) and ``meta`` (UTF-8 JSON as uint8):
the format, the text's and the tokenizer files' sha256, the transformers and tokenizers versions,
the paragraph and token counts and the sha256 of the two arrays' bytes. It is written atomically
(:func:`gradscope.files.io.atomic_write`) and verified on every use: a cache whose key, sizes or
array hashes disagree is reported as stale (None), never used.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.files.io import atomic_write
from gradscope.errors import GradscopeError
from gradscope.guard import check_bytes

FORMAT = "gradscope-tokens"
KEY_FIELDS = ("format", "text_sha256", "tokenizer_sha256", "transformers", "tokenizers")


def array_sha256(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values).view(np.uint8).tobytes()).hexdigest()


def write_token_cache(path: Path, tokens: np.ndarray, offsets: np.ndarray, key: dict[str, Any]) -> None:
    """Write the cache atomically; ``key`` holds :data:`KEY_FIELDS` but ``format``."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    meta = {"format": FORMAT, **key, "paragraphs": int(offsets.size - 1), "token_count": int(tokens.size),
            "tokens_sha256": array_sha256(tokens), "offsets_sha256": array_sha256(offsets)}
    blob = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, tokens=tokens, offsets=offsets, meta=blob)

    atomic_write(path, write, what="token cache")


def read_token_cache(path: Path, key: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """(tokens, offsets) of the cache at ``path`` if it is there and verifies against ``key``
    (:data:`KEY_FIELDS` but ``format``); None if it is absent, unreadable, for another text or
    tokenizer, or altered."""
    path = Path(path)
    if not path.is_file():
        return None
    size = path.stat().st_size
    try:  # a cache too large to read (a 137 GB claimed size, say) cannot verify: stale, tokenised again
        check_bytes(2 * size, f"token cache: {path}")
    except GradscopeError:
        return None
    try:
        blob = io.BytesIO(path.read_bytes())
        with zipfile.ZipFile(blob) as z:  # what the members expand to, before any is read (a zip bomb)
            if sum(i.file_size for i in z.infolist()) > 2 * size + (1 << 20):
                return None
        with np.load(blob, allow_pickle=False) as data:
            if sorted(data.files) != ["meta", "offsets", "tokens"]:
                return None
            meta = json.loads(data["meta"].tobytes().decode("utf-8"))
            tokens, offsets = data["tokens"], data["offsets"]
    except (OSError, ValueError, KeyError, UnicodeDecodeError, zipfile.BadZipFile, EOFError, RecursionError):
        return None
    want = {"format": FORMAT, **key}
    if not isinstance(meta, dict) or any(meta.get(k) != want[k] for k in KEY_FIELDS):
        return None
    if tokens.dtype != np.int32 or offsets.dtype != np.int64 or tokens.ndim != 1 or offsets.ndim != 1:
        return None
    if offsets.size < 2 or offsets[0] != 0 or offsets[-1] != tokens.size or bool((np.diff(offsets) < 0).any()):
        return None
    if meta.get("tokens_sha256") != array_sha256(tokens) or meta.get("offsets_sha256") != array_sha256(offsets):
        return None
    if tokens.size and int(tokens.min()) < 0:
        return None
    return tokens, offsets
