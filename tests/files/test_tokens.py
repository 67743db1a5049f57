"""The token cache of a raw text (``files.tokens``), as tokenising a text writes and reads it: beside the
text, verified on every use; an altered cache, one whose members expand far beyond the file (a zip
bomb) and one of a huge claimed size are never read but replaced; another text has another key. The tiny
model and text come from tests/workflows/text/test_accuracy.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from gradscope.workflows.text.tokenize import TokenCacheWarning, tokenize_text  # noqa: E402
from tests.workflows.text.test_accuracy import saved  # noqa: E402,F401 - the fixture


def test_the_tokens_are_cached_beside_the_text_and_verified(saved, tmp_path: Path) -> None:  # noqa: ANN001
    model_dir, text = saved
    copy = tmp_path / "text.txt"
    copy.write_bytes(text.read_bytes())
    first = tokenize_text(copy, model_dir)
    assert not first.from_cache and first.cache is not None and first.cache.parent == tmp_path / ".gradscope-cache"
    again = tokenize_text(copy, model_dir)
    assert again.from_cache and np.array_equal(again.tokens, first.tokens)
    data = dict(np.load(first.cache))
    data["tokens"] = data["tokens"].copy()
    data["tokens"][0] ^= 1  # an altered cache is never used
    with open(first.cache, "wb") as fh:
        np.savez(fh, **data)
    with pytest.warns(TokenCacheWarning, match="does not verify"):
        fresh = tokenize_text(copy, model_dir)
    assert not fresh.from_cache and np.array_equal(fresh.tokens, first.tokens)
    with open(first.cache, "wb") as fh:  # members that expand far beyond the file (a zip bomb): not read
        np.savez_compressed(fh, tokens=np.zeros(50_000_000, np.int32), offsets=data["offsets"], meta=data["meta"])
    with pytest.warns(TokenCacheWarning, match="does not verify"):
        assert not tokenize_text(copy, model_dir).from_cache
    with open(first.cache, "wb") as fh:  # a cache of 137 GB claimed size (sparse): stale, never read, replaced
        fh.truncate(137 << 30)
    with pytest.warns(TokenCacheWarning, match="does not verify"):
        assert not tokenize_text(copy, model_dir).from_cache
    assert first.cache.stat().st_size < 1 << 20 and tokenize_text(copy, model_dir).from_cache
    copy.write_text(copy.read_text() + "the cat\n")  # another text: another key
    assert not tokenize_text(copy, model_dir).from_cache
