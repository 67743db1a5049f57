"""Language modelling on a text corpus end to end: every core trains and resumes, the commands run on
an lm run, and bad input is one line. A tiny corpus is written here (vocabulary 60 pieces; hidden size 8)
and used by the lm family's unit tests too: preparing it (tests/workflows/test_corpus.py), its rows
(tests/tasks/test_lm.py), its counts (tests/analysis/test_lm.py) and its probes
(tests/workflows/families/test_lm.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from gradscope.analysis.perplexity import FREQ_LABELS
from gradscope.cli.app import app
from gradscope.config import RunConfig
from gradscope.corpus import open_corpus
from gradscope.workflows.corpus import CorpusOptions, prepare_corpus
from gradscope.errors import GradscopeError
from gradscope.models.registry import CORES, core_class
from gradscope.presets import build_config
from gradscope.files.checkpoint import load
from gradscope.train.loop import train

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "big", "red", "house", "with", "blue",
         "door", "under", "tree", "old", "man", "saw", "small", "bird", "in", "green", "field", "quick", "fox",
         "jumps", "over", "lazy", "river", "bank", "sun", "rose", "above", "hill", "zebra", "yak", "quartz"]


def write_raw(path: Path, paragraphs_: int = 240, seed: int = 0) -> list[str]:
    """WikiText-like raw text: headings, blank lines, one paragraph per line (Zipfian words)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(WORDS) + 1)
    paras = [" ".join(rng.choice(WORDS, int(rng.integers(3, 40)), p=p / p.sum())) for _ in range(paragraphs_)]
    lines = []
    for i, para in enumerate(paras):
        if i % 40 == 0:
            lines += ["", f" = Section {i} = ", "", f" = = Sub {i} = = ", ""]
        lines.append(" " + para + " ")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paras


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lm")
    write_raw(root / "raw.txt")
    prepare_corpus(root / "raw.txt", root / "corpus", opts=CorpusOptions(vocab_size=60, valid=0.1, test=0.1))
    return root / "corpus"


def lm_config(corpus: Path, core: str = "lstm", pe: str = "none", length: int = 24, iterations: int = 3) -> RunConfig:
    base = build_config("tiny", {"task": "lm", "corpus": str(corpus), "length": length, "core": core, "pe": pe,
                                 "embed_size": 8, "hidden_size": 8, "iterations": iterations, "batch_size": 8,
                                 "checkpoint_every": iterations, "log_every": 1, "warmup": 1, "heldout_size": 8})
    return dataclasses.replace(base, model=dataclasses.replace(base.model,
                                                               core_config=dict(core_class(core).tiny_config)))


@pytest.mark.parametrize("core", sorted(CORES))
def test_every_core_trains_and_resumes_with_and_without_pe(corpus_dir: Path, tmp_path: Path, core: str) -> None:
    for pe in ("none", "sinusoidal"):
        cfg = lm_config(corpus_dir, core=core, pe=pe, iterations=2)
        result = train(cfg, tmp_path / pe, stop_after=1)
        assert result == {}
        result = train(cfg, tmp_path / pe, resume=True)
        assert result["iteration"] == 2 and 0 <= result["uniform"]["token_accuracy"] <= 1
        assert load(tmp_path / pe).config.task.corpus_sha256 == open_corpus(corpus_dir).sha256


def test_cli_train_accuracy_summarize_stability(corpus_dir: Path, tmp_path: Path, runner, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    common = ["train", "--task", "lm", "--corpus", str(corpus_dir), "--core", "lstm", "--embed-size", "8", "--hidden-size",
              "8", "--max-length", "16", "--iterations", "4", "--batch-size", "8", "--checkpoint-every", "4",
              "--warmup", "1", "-q"]
    for pe in ("none", "sinusoidal"):
        for seed in ("1", "2"):
            r = runner.invoke(app, common + ["--pe", pe, "--seed", seed, "-o", f"run-{pe}-{seed}"])
            assert r.exit_code == 0, r.stderr
            r = runner.invoke(app, ["accuracy", f"run-{pe}-{seed}", "-o", f"acc-{pe}-{seed}.zarr", "-q"])
            assert r.exit_code == 0, r.stderr
            assert "perplexity" in r.stdout and "decile10" in r.stdout
    import xarray as xr
    ds = xr.open_zarr("acc-none-1.zarr", consolidated=False)
    assert list(ds["freq_bin"].values) == list(FREQ_LABELS)
    assert math.isclose(float(ds["perplexity"][0]), math.exp(float(ds["cross_entropy"][0])), rel_tol=1e-9)
    assert int(ds["freq_n"].values[:2].sum()) == int(ds["pos_n"].values.sum())
    r = runner.invoke(app, ["summarize", "acc-none-1.zarr", "acc-none-2.zarr", "acc-sinusoidal-1.zarr",
                            "acc-sinusoidal-2.zarr", "--by", "pe", "--compare", "pe"])
    assert r.exit_code == 0, r.stderr
    assert "perplexity/rare" in r.stdout and "perplexity/frequent" in r.stdout
    r = runner.invoke(app, ["report", "acc-none-1.zarr", "acc-sinusoidal-1.zarr", "-o", "report.html"])
    assert r.exit_code == 0, r.stderr
    assert "Language model: perplexity by token frequency and position" in Path("report.html").read_text()
    r = runner.invoke(app, ["stability", "run-none-1", "--target-pos", "2", "--length", "8", "--triplets", "3",
                            "-o", "st.zarr", "-q"])
    assert r.exit_code == 0, r.stderr
    assert "frequent/text" in r.stdout and "rare/text" in r.stdout
    r = runner.invoke(app, ["dynamics", "run-sinusoidal-1", "--sequences", "2", "--steps", "20", "--trajectories", "1",
                            "-o", "dyn.zarr", "-q"])
    assert r.exit_code == 0, r.stderr
    dyn = xr.open_zarr("dyn.zarr", consolidated=False)
    classes = set(np.asarray(dyn["token_class"].values).ravel())
    assert {"start", "frequent"} <= classes <= {"start", "frequent", "rare"}
    assert dyn.sizes["step"] == 16  # the rows themselves: no output phase on a language model


def test_one_line_errors(corpus_dir: Path, tmp_path: Path, runner) -> None:
    def fails(args: list[str], words: str) -> None:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and words in r.stderr, r.stderr

    (tmp_path / "empty.txt").write_text("\n = Only = \n\n", encoding="utf-8")
    fails(["corpus", "prepare", str(tmp_path / "empty.txt"), "-o", str(tmp_path / "e")], "0 paragraph")
    write_raw(tmp_path / "raw.txt", paragraphs_=60)
    fails(["corpus", "prepare", str(tmp_path / "raw.txt"), "-o", str(tmp_path / "big"), "--vocab", "5000"],
          "supports at most")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    fails(["corpus", "prepare", str(tmp_path / "latin1.txt"), "-o", str(tmp_path / "l")], "not UTF-8")
    base = ["train", "--task", "lm", "--core", "lstm", "--iterations", "1", "-q", "-o", str(tmp_path / "run")]
    fails(base, "needs a corpus")
    fails(base + ["--corpus", str(tmp_path)], "manifest.json")
    for name, damage in (("train.tokens.npy", b"\x93NUMPY garbage"), ("manifest.json", b"{not json"),
                         ("train.offsets.npy", None)):
        broken = tmp_path / f"broken-{name}"
        prepare_corpus(tmp_path / "raw.txt", broken, opts=CorpusOptions(vocab_size=40))
        if damage is None:
            (broken / name).unlink()
        else:
            (broken / name).write_bytes(damage)
        fails(base + ["--corpus", str(broken)], "corpus")
    empty = tmp_path / "emptyfiles"
    prepare_corpus(tmp_path / "raw.txt", empty, opts=CorpusOptions(vocab_size=40))
    (empty / "test.tokens.npy").write_bytes(b"")
    fails(base + ["--corpus", str(empty)], "corpus")
    fails(base + ["--corpus", str(corpus_dir), "--vocab-size", "61"], "--vocab-size")
    # a vocabulary SentencePiece cannot parse, an output under a file, a manifest nested past the parser
    fails(["corpus", "prepare", str(tmp_path / "raw.txt"), "-o", str(tmp_path / "huge"), "--vocab", "2147483648"],
          "vocab: got 2147483648")
    (tmp_path / "afile").write_text("x")
    fails(["corpus", "prepare", str(tmp_path / "raw.txt"), "-o", str(tmp_path / "afile" / "sub")], "not a directory")
    nested = tmp_path / "nested"
    prepare_corpus(tmp_path / "raw.txt", nested, opts=CorpusOptions(vocab_size=40))
    (nested / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    fails(base + ["--corpus", str(nested)], "not valid JSON")
    with pytest.raises(GradscopeError, match="valid_file/test_file"):
        prepare_corpus(tmp_path / "raw.txt", tmp_path / "x", opts=CorpusOptions(valid_file=tmp_path / "raw.txt"))
    # split files that hold the same text (the same file twice, or a copy): test would score what valid holds
    copy = tmp_path / "copy.txt"
    copy.write_bytes((tmp_path / "raw.txt").read_bytes())
    other = tmp_path / "other.txt"
    other.write_text("a paragraph of its own for the held-out split\n")
    fails(["corpus", "prepare", str(tmp_path / "raw.txt"), "-o", str(tmp_path / "same"), "--valid-file", str(other),
           "--test-file", str(other)], "holds the same text as the valid split")
    fails(["corpus", "prepare", str(tmp_path / "raw.txt"), "-o", str(tmp_path / "same"), "--valid-file", str(copy),
           "--test-file", str(other)], "holds the same text as the train split")
    assert not (tmp_path / "same").exists()


def test_a_moved_corpus_is_named_with_corpus_and_a_loaded_checkpoint_equals_its_path(
        corpus_dir: Path, tmp_path: Path, runner, monkeypatch) -> None:
    """accuracy, stability and dynamics read a moved corpus given by --corpus (a missing one is a
    one-line error naming the flag); the Python API gives the same stability for a Loaded checkpoint
    as for its path (the lm probes and scoring, not a wrapped model's)."""
    import shutil

    import gradscope

    monkeypatch.chdir(tmp_path)
    shutil.copytree(corpus_dir, tmp_path / "corpus")
    r = runner.invoke(app, ["train", "--task", "lm", "--corpus", "corpus", "--core", "gru", "--embed-size", "8", "--hidden-size",
                            "8", "--max-length", "12", "--iterations", "2", "--batch-size", "4", "--checkpoint-every",
                            "2", "--warmup", "1", "-q", "-o", "run"])
    assert r.exit_code == 0, r.stderr
    by_path = gradscope.stability("run", target_pos=2, length=8, triplets=2)
    by_loaded = gradscope.stability(gradscope.load("run"), target_pos=2, length=8, triplets=2)
    np.testing.assert_array_equal(by_loaded["score_default"].values, by_path["score_default"].values)
    (tmp_path / "corpus").rename(tmp_path / "moved")
    checks = [["accuracy", "run", "-o", "a.zarr"], ["stability", "run", "--target-pos", "2", "--length", "8",
                                                   "--triplets", "2", "-o", "s.zarr"],
              ["dynamics", "run", "--sequences", "1", "--steps", "10", "--trajectories", "1", "-o", "d.zarr"]]
    for args in checks:
        r = runner.invoke(app, args + ["-q"])
        assert r.exit_code == 2 and "corpus" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        r = runner.invoke(app, args + ["-q", "--corpus", "moved"])
        assert r.exit_code == 0, r.stderr
    moved = gradscope.stability("run", target_pos=2, length=8, triplets=2, corpus="moved")
    np.testing.assert_array_equal(moved["score_default"].values, by_path["score_default"].values)


def test_tokens_per_second_counts_real_tokens_not_padding(corpus_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """With a clock that ticks one second per reading, each log line's tokens_per_s is exactly the
    scored (real) tokens of its window, not batch × L padded positions."""
    import itertools
    import json
    import types

    import gradscope.train.loop as loop

    cfg = lm_config(corpus_dir, length=24, iterations=4)
    cfg = RunConfig(model=cfg.model, task=cfg.task, train=dataclasses.replace(cfg.train, log_every=2))
    clock = itertools.count()
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    scored: list[int] = []
    original = loop.loss_and_correct

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        scored.append(int(out[2]))
        return out

    monkeypatch.setattr(loop, "loss_and_correct", recording)
    train(cfg, tmp_path / "run")
    entries = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [e["tokens_per_s"] for e in entries] == [sum(scored[0:2]), sum(scored[2:4])]
    assert all(e["tokens_per_s"] < cfg.train.batch_size * 24 * 2 for e in entries)  # padded: batch × L × steps


def test_lm_option_errors_name_their_flags(corpus_dir: Path, tmp_path: Path, runner) -> None:
    r = runner.invoke(app, ["train", "--task", "lm", "--corpus", str(corpus_dir), "--core", "gru", "--embed-size", "8",
                            "--hidden-size", "8", "--max-length", "12", "--iterations", "2", "--batch-size", "4",
                            "--checkpoint-every", "2", "--warmup", "1", "-q", "-o", str(tmp_path / "run")])
    assert r.exit_code == 0, r.stderr
    for args, flag in ((["accuracy", "--decoding", "teacher"], "--decoding: got 'teacher'"),
                       (["stability", "--target-pos", "40"], "--target-pos: got 40")):
        r = runner.invoke(app, [args[0], str(tmp_path / "run"), *args[1:], "-q", "-o", str(tmp_path / "x.zarr")])
        assert r.exit_code == 2 and flag in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "x.zarr").exists()


def test_a_raw_text_store_is_read_as_the_lm_family(corpus_dir: Path, tmp_path: Path, runner) -> None:
    """A store of the raw-text path (task "text", no registered family: `accuracy --text`) is read as the
    lm family (tasks.registry.READ_AS): its family, its summary metrics and its report section are lm's,
    from lm's declarations. Here an lm store relabelled as the raw-text path labels its stores."""
    import json

    from gradscope.store import read_store
    from gradscope.store.accuracy import store_family
    from gradscope.store.io import write_store
    from gradscope.tasks.registry import TASKS

    train(lm_config(corpus_dir, iterations=1), tmp_path / "run")
    r = runner.invoke(app, ["accuracy", str(tmp_path / "run"), "-o", str(tmp_path / "lm.zarr"), "-q"])
    assert r.exit_code == 0, r.stderr
    ds = read_store(tmp_path / "lm.zarr").load()
    text = {**json.loads(ds.attrs["task_config"]), "name": "text"}
    entries = [{**e, "task_config": text} for e in json.loads(ds.attrs["checkpoints"])]
    ds.attrs.update(task_config=json.dumps(text), checkpoints=json.dumps(entries))
    write_store(ds, tmp_path / "text.zarr")
    assert store_family(read_store(tmp_path / "text.zarr")) is TASKS["lm"]
    r = runner.invoke(app, ["summarize", str(tmp_path / "text.zarr"), "-o", str(tmp_path / "s.zarr")])
    assert r.exit_code == 0 and "perplexity/decile1" in r.stdout, r.stderr
    r = runner.invoke(app, ["report", str(tmp_path / "text.zarr"), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0 and 'id="task-lm"' in (tmp_path / "r.html").read_text(), r.stderr


def test_an_lm_store_whose_frequency_bins_repeat_is_refused(corpus_dir: Path, tmp_path: Path, runner) -> None:
    """The lm family's freq_bin is a label coordinate of its declared part (a string over its own
    dimension), so labels that repeat are refused on read, as every family's are: before, such a store
    was read, and its summary named two metrics perplexity/frequent."""
    from gradscope.store import read_store
    from gradscope.store.io import write_store

    train(lm_config(corpus_dir, iterations=1), tmp_path / "run")
    r = runner.invoke(app, ["accuracy", str(tmp_path / "run"), "-o", str(tmp_path / "lm.zarr"), "-q"])
    assert r.exit_code == 0, r.stderr
    ds = read_store(tmp_path / "lm.zarr").load()
    labels = np.asarray(["frequent"] * ds.sizes["freq_bin"], dtype=object)
    write_store(ds.assign_coords(freq_bin=labels), tmp_path / "bad.zarr")
    with pytest.raises(GradscopeError, match="freq_bin labels repeat"):
        read_store(tmp_path / "bad.zarr")
    r = runner.invoke(app, ["summarize", str(tmp_path / "bad.zarr"), "-o", str(tmp_path / "s.zarr")])
    assert r.exit_code == 2 and "freq_bin labels repeat" in r.stderr, r.output
