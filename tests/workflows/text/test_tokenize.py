"""A text's tokens, cached beside it: a foreign or truncated token cache is never used, and a tokenizer
truncated or swapped after a first run is one line. The tiny model and text come from
tests/workflows/text/test_probes.py; the cache's own checks are tested in tests/files/test_tokens.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from gradscope.cli.app import app  # noqa: E402
from gradscope.store.io import read_store  # noqa: E402
from gradscope.workflows.text.tokenize import TokenCacheWarning, tokenize_text  # noqa: E402
from tests.workflows.text.test_accuracy import make_text, refused  # noqa: E402
from tests.workflows.text.test_probes import saved  # noqa: E402,F401 - the fixture


def _copy_text(src: Path, folder: Path, name: str = "text.txt") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / name
    out.write_bytes(src.read_bytes())
    return out


def test_a_foreign_or_truncated_token_cache_is_never_used(saved, tmp_path: Path) -> None:  # noqa: ANN001, F811
    model_dir, text = saved
    mine = _copy_text(text, tmp_path / "a")
    other = tmp_path / "b" / "text.txt"
    other.parent.mkdir()
    other.write_text(make_text(7, 30))
    first, theirs = tokenize_text(mine, model_dir), tokenize_text(other, model_dir)
    assert first.cache is not None and theirs.cache is not None and first.cache != theirs.cache
    shutil.copyfile(theirs.cache, first.cache)  # another text's cache, where this text's belongs
    with pytest.warns(TokenCacheWarning, match="does not verify"):
        again = tokenize_text(mine, model_dir)
    assert not again.from_cache and np.array_equal(again.tokens, first.tokens)
    data = first.cache.read_bytes()
    first.cache.write_bytes(data[:len(data) // 2])  # a half-written cache (a killed writer without the rename)
    with pytest.warns(TokenCacheWarning, match="does not verify"):
        assert np.array_equal(tokenize_text(mine, model_dir).tokens, first.tokens)
    first.cache.write_bytes(b"PK\x03\x04" + os.urandom(200))  # a zip header and noise
    with pytest.warns(TokenCacheWarning, match="does not verify"):
        assert np.array_equal(tokenize_text(mine, model_dir).tokens, first.tokens)
    assert tokenize_text(mine, model_dir).from_cache  # rewritten whole


def test_a_tokenizer_truncated_or_swapped_after_a_first_run_is_one_line(saved, runner, tmp_path: Path) -> None:  # noqa: ANN001, F811
    model_dir, text = saved
    local = tmp_path / "model"
    shutil.copytree(model_dir, local)
    out = tmp_path / "acc.zarr"
    args = ["accuracy", str(local), "--model", "hf", "--text", str(text), "--max-length", "64", "--resamples", "20",
            "-q", "-o", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    tok = local / "tokenizer.json"
    good = tok.read_bytes()
    tok.write_bytes(good[:len(good) // 3])
    refused(runner.invoke(app, [*args, "--overwrite"]), "--tokenizer")
    assert read_store(out, kind="accuracy") is not None  # the old store is untouched
    tok.write_text('{"version": "1.0", "model": {"type": "Unigram", "vocab": [["x", 1e9]]}}')  # foreign, nonsense
    refused(runner.invoke(app, [*args, "--overwrite"]), "--tokenizer")
    tok.write_bytes(good)
    assert runner.invoke(app, [*args, "--overwrite"]).exit_code == 0
