"""Hostile input on the text surfaces: foreign, truncated and altered token caches and
tokenizer files, a text changed after a first run, and kill -9 during `reproduce --text`, then resume."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from gradscope.cli.app import app  # noqa: E402
from gradscope.store.io import read_store  # noqa: E402
from gradscope.workflows.text.tokenize import TokenCacheWarning, tokenize_text  # noqa: E402
from tests.workflows.text.test_accuracy import make_text, refused  # noqa: E402
from tests.workflows.text.test_probes import LENGTH, POS, saved  # noqa: E402,F401 - the fixture

BIN = Path(sys.executable).with_name("gradscope")


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


def _reproduce(model_dir: Path, text: Path, out: Path) -> list[str]:
    return [str(BIN), "reproduce", "--model-dir", str(model_dir), "--text", str(text), "-o", str(out), "--triplets", "3",
            "--target-pos", str(POS), "--probe-length", str(LENGTH), "--max-length", "64", "--resamples", "50",
            "--budget-seconds", "120"]


def test_reproduce_text_killed_then_resumed_equals_the_uninterrupted_study(saved, tmp_path: Path) -> None:  # noqa: ANN001, F811
    """kill -9 once the accuracy store is published (stability running), run the same command again: it skips
    what was finished, leaves no temporaries, and ends with the stores of a run never killed. Then the
    text is changed: the finished study is refused, not mixed in."""
    if not BIN.exists():
        pytest.skip("the gradscope console script is not installed beside this interpreter")
    model_dir, text = saved
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRADSCOPE_RATES": "reference"}
    whole = tmp_path / "whole"
    done = subprocess.run(_reproduce(model_dir, text, whole), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_reproduce(model_dir, text, killed), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not (killed / "accuracy.zarr").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (killed / "accuracy.zarr").exists() and not (killed / "report.html").exists()
    again = subprocess.run(_reproduce(model_dir, text, killed), env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "skipped" in again.stdout  # the accuracy store was kept, not recomputed
    assert sorted(p.name for p in killed.iterdir()) == sorted(p.name for p in whole.iterdir())
    for kind in ("accuracy", "stability", "dynamics"):
        a, b = read_store(whole / f"{kind}.zarr", kind=kind), read_store(killed / f"{kind}.zarr", kind=kind)
        assert set(a.data_vars) == set(b.data_vars), kind
        for name in a.data_vars:
            x, y = a[name].values, b[name].values
            if x.dtype.kind == "f":
                np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-9, equal_nan=True, err_msg=f"{kind}/{name}")
            else:
                assert np.array_equal(x, y), f"{kind}/{name}"
    changed = _copy_text(text, tmp_path / "t2")
    first = subprocess.run(_reproduce(model_dir, changed, tmp_path / "study2"), env=env, capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    changed.write_text(changed.read_text() + "\nthe cat sat on the mat under the big tree\n")
    refusal = subprocess.run(_reproduce(model_dir, changed, tmp_path / "study2"), env=env, capture_output=True,
                             text=True, timeout=600)
    assert refusal.returncode == 2 and refusal.stderr.startswith("error: ") and \
        len(refusal.stderr.strip().splitlines()) == 1 and "another study" in refusal.stderr, refusal.stderr
