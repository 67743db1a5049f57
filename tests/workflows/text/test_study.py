"""The text study (``reproduce --model-dir DIR --text FILE``, ``gradscope.reproduce_text``): the accuracy,
stability and dynamics stores of a text and the report, keyed by content and resumed, with option errors
before any store; on a Mamba, a Mamba-2, a hybrid and a transformer; killed (kill -9) and run again, the
stores of an uninterrupted study. The tiny model and text come from tests/workflows/text/test_probes.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import gradscope  # noqa: E402
from gradscope.cli.app import app  # noqa: E402
from gradscope.store.io import read_store  # noqa: E402
from tests.workflows.text.test_accuracy import make_text, refused, save_tokenizer  # noqa: E402
from tests.workflows.text.test_probes import LENGTH, POS, encoded, rows_of, saved  # noqa: E402,F401 - the fixture
from tests.workflows.text.test_tokenize import _copy_text  # noqa: E402


BIN = Path(sys.executable).with_name("gradscope")


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


def test_reproduce_with_a_model_and_a_text_writes_the_study_and_resumes(saved, runner, tmp_path: Path) -> None:  # noqa: ANN001
    """``reproduce --model-dir DIR --text FILE -o OUT``: the accuracy, stability and dynamics stores of the
    text (the accuracy store's perplexity is the one ``accuracy --text`` gives; the stability probes
    are paragraph rows of the text) and the report; run again, every step is skipped and nothing is
    rewritten; with another option, the finished stores are refused, not mixed in."""


    model_dir, text = saved
    ids, bos, _ = encoded(model_dir, text)
    out = tmp_path / "study"
    args = ["reproduce", "--model-dir", str(model_dir), "--text", str(text), "-o", str(out), "--triplets", "3",
            "--target-pos", str(POS), "--probe-length", str(LENGTH), "--max-length", "64", "--resamples", "50",
            "--budget-seconds", "20"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert sorted(p.name for p in out.iterdir()) == ["accuracy.zarr", "dynamics.zarr", "report.html", "stability.zarr"]
    acc = read_store(out / "accuracy.zarr", kind="accuracy")
    direct = gradscope.accuracy(model_dir, model_factory="hf", text=text, max_length=64, resamples=50)
    assert float(acc["perplexity"][0]) == pytest.approx(float(direct["perplexity"][0]), rel=1e-9)
    stab = read_store(out / "stability.zarr", kind="stability")
    assert all(tuple(r) in rows_of(ids, bos) for r in stab["probe_tokens"].values[:, 0])
    assert set(read_store(out / "dynamics.zarr", kind="dynamics")["token_class"].values.ravel()) <= \
        {"start", "frequent", "rare"}
    page = (out / "report.html").read_text()
    assert "stability" in page and "lyapunov" in page.lower()
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = runner.invoke(app, args)
    assert again.exit_code == 0, (again.stdout, again.stderr)
    assert again.stdout.count("skipped") == 3
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.suffix == ".zarr"} == \
        {k: v for k, v in stamps.items() if k.endswith(".zarr")}
    refused(runner.invoke(app, [*args, "--seed", "1"]), "another study", "accuracy.zarr")
    refused(runner.invoke(app, ["reproduce", "--model-dir", str(model_dir), "-o", str(out)]), "--model-dir/--text")
    refused(runner.invoke(app, [*args, "--scale", "paper"]), "--scale")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n")
    fresh = tmp_path / "fresh"
    refused(runner.invoke(app, ["reproduce", "--model-dir", str(model_dir), "--text", str(blank), "-o", str(fresh)]),
            "--text", "no paragraph")
    assert not fresh.exists()  # a refused input leaves no study folder behind
    refused(runner.invoke(app, ["reproduce", "--model-dir", str(model_dir), "--text", str(text), "-o", str(fresh),
                                "--probe-length", "100000"]), "--probe-length",
            "no paragraph")  # before any work: no accuracy store first
    assert not fresh.exists()
    # from Python, with the same options: every step is skipped
    study = gradscope.reproduce_text(model_dir, text=text, out=out, triplets=3, target_pos=POS,
                                     probe_length=LENGTH, max_length=64, resamples=50, budget_seconds=20)
    assert study.ran == () and sorted(study.stores) == ["accuracy", "dynamics", "stability"]


@pytest.mark.parametrize(("extra", "words"), [
    (["--probe-length", "8"], ("--target-pos", "probe_length 8")),          # the default target position, 16
    (["--target-pos", "40", "--probe-length", "10"], ("--target-pos",)),
    (["--probe-length", "1"], ("--probe-length",)),                         # it named `length`
    (["--budget-seconds", "1e-3"], ("--budget-seconds",)),                  # it named checkpoint_budget_seconds
])
def test_reproduce_text_option_errors_come_before_any_store(saved, runner, tmp_path: Path, extra: list[str],  # noqa: ANN001
                                                            words: tuple[str, ...]) -> None:
    """Each was refused only after accuracy.zarr was written, and some named another command's option."""
    model_dir, text = saved
    out = tmp_path / "study"
    result = runner.invoke(app, ["reproduce", "--model-dir", str(model_dir), "--text", str(text), "-o", str(out),
                                 "--triplets", "3", *extra])
    refused(result, *words)
    import re
    assert "checkpoint_budget_seconds" not in result.stderr and not re.search(r"(?<![-_])length:", result.stderr)
    assert not out.exists()


def test_a_text_study_is_keyed_by_content_never_by_path(saved, runner, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The same text by a relative path is the same study; a tokenizer replaced in place is another; a huge
    text is refused before anything is hashed, and a stray large file beside the model is not read."""
    import shutil


    from gradscope.workflows.study.options import TextStudyOptions
    from gradscope.workflows.text.study import study_key

    model_dir, text = saved
    local = tmp_path / "model"
    shutil.copytree(model_dir, local)
    opts = TextStudyOptions(text=str(text))
    monkeypatch.chdir(text.parent)
    assert study_key(local, TextStudyOptions(text=text.name)) == study_key(local, opts)
    with open(local / "stray.bin.partial", "wb") as fh:  # sparse: 64 GiB on paper; not a model file
        fh.truncate(64 << 30)
    assert study_key(local, opts) == study_key(model_dir, opts)
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as fh:
        fh.truncate(64 << 30)
    with pytest.raises(gradscope.GradscopeError, match="^text: tokenising .* memory"):
        study_key(local, TextStudyOptions(text=str(huge)))
    out = tmp_path / "study"
    args = ["reproduce", "--model-dir", str(local), "--text", text.name, "-o", str(out), "--triplets", "3",
            "--target-pos", str(POS), "--probe-length", str(LENGTH), "--max-length", "64", "--resamples", "50",
            "--budget-seconds", "20"]
    assert runner.invoke(app, args).exit_code == 0
    again = runner.invoke(app, [*args[:4], str(text), *args[5:]])  # the absolute path: the same study
    assert again.exit_code == 0 and again.stdout.count("skipped") == 3, again.stdout
    tok = json.loads((local / "tokenizer.json").read_text())  # the same tokenizer with its ids permuted
    vocab = tok["model"]["vocab"]
    ids = sorted(vocab.values())
    tok["model"]["vocab"] = dict(zip(vocab, ids[1:] + ids[:1]))
    (local / "tokenizer.json").write_text(json.dumps(tok))
    refused(runner.invoke(app, args), "another study")


def small_study(runner, tmp_path: Path, name: str, build) -> tuple[Path, Path, Path]:  # noqa: ANN001
    """``reproduce --model-dir DIR --text FILE`` (small options) on ``build(vocab)`` saved with the tokenizer of a
    small text beside it, which must succeed and write the three stores and the report: (out, model_dir, text)."""
    text_path = tmp_path / "text.txt"
    text = make_text(2, 60)
    text_path.write_text(text)
    model_dir = tmp_path / name
    save_tokenizer(model_dir, text)
    vocab = len(transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True))
    torch.manual_seed(0)
    build(vocab).eval().save_pretrained(model_dir)
    out = tmp_path / "study"
    result = runner.invoke(app, ["reproduce", "--model-dir", str(model_dir), "--text", str(text_path), "-o", str(out),
                                 "--triplets", "3", "--target-pos", str(POS), "--probe-length", str(LENGTH),
                                 "--max-length", "64", "--resamples", "50", "--budget-seconds", "20"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert sorted(p.name for p in out.iterdir()) == ["accuracy.zarr", "dynamics.zarr", "report.html", "stability.zarr"]
    return out, model_dir, text_path


def test_reproduce_with_text_runs_on_a_mamba2(runner, tmp_path: Path) -> None:  # noqa: ANN001
    """Issue #48: ``reproduce --model-dir DIR --text FILE`` on a saved transformers Mamba-2 (tokenizer beside
    it) writes the three stores and the report; the stability probes are rows of the text."""
    out, model_dir, text_path = small_study(runner, tmp_path, "mamba2", lambda vocab: transformers.Mamba2ForCausalLM(
        transformers.Mamba2Config(vocab_size=vocab, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2,
                                  conv_kernel=3, num_heads=4, head_dim=8, n_groups=1, chunk_size=8)))
    ids, bos, _ = encoded(model_dir, text_path)
    stab = read_store(out / "stability.zarr", kind="stability")
    assert all(tuple(r) in rows_of(ids, bos) for r in stab["probe_tokens"].values[:, 0])
    assert np.isfinite(stab["score_default"].values).all()
    assert "hf-mamba2" in json.dumps(read_store(out / "dynamics.zarr", kind="dynamics").attrs) or \
        "Mamba2" in json.dumps(read_store(out / "dynamics.zarr", kind="dynamics").attrs)


@pytest.mark.parametrize("kind", ["qwen3next", "llama"])
def test_reproduce_with_text_runs_on_a_hybrid_and_a_transformer(kind: str, runner, tmp_path: Path) -> None:  # noqa: ANN001
    """Issue #49: the same study on a Gated DeltaNet hybrid (Qwen3-Next) and a Llama transformer: the attention
    caches are sized to the rows; the hybrid's dynamics hold them as inputs (the store says so); the
    transformer's dynamics are the flow and grid (its step spectra and exponents are not defined)."""
    def build(vocab: int) -> torch.nn.Module:
        common = dict(vocab_size=vocab, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
        if kind == "llama":
            return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
        return transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
            **common, layer_types=["linear_attention", "full_attention"], linear_num_value_heads=2,
            linear_num_key_heads=1, linear_key_head_dim=4, linear_value_head_dim=4, linear_conv_kernel_dim=3,
            num_experts=0))

    out, _, _ = small_study(runner, tmp_path, kind, build)
    stab = read_store(out / "stability.zarr", kind="stability")
    assert np.isfinite(stab["score_default"].values).all()
    dyn = read_store(out / "dynamics.zarr", kind="dynamics")
    assert "flow_fro" in dyn
    if kind == "llama":
        assert "lyapunov" not in dyn and "step_radius" not in dyn
    else:
        assert dyn.attrs["held"] == "l1/keys, l1/values"
