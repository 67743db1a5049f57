"""The language-modelling study's plan (``gradscope.workflows.study.lm``): the tiny corpus's raw text, each
scale's corpus settings and LSTM configuration, where its corpus is prepared (and that it is prepared once),
and the vanilla/PE × seeds runs, on a small corpus prepared here. The study run end to end is
tests/cli/test_reproduce.py's; its options' refusals, tests/workflows/study/test_options.py's."""

from __future__ import annotations

import re
from pathlib import Path

import pydoc_data.topics
import pytest

from gradscope.corpus import open_corpus
from gradscope.errors import GradscopeError
from gradscope.workflows.corpus import CorpusOptions, prepare_corpus
from gradscope.workflows.study import lm
from gradscope.workflows.study.lm import (LM_SCALES, ROW_LENGTH, corpus_settings, lm_base, plan_lm_runs,
                                          prepare_study_corpus, tiny_raw_text)
from gradscope.workflows.study.runs import PES

from tests.helpers.hardening import write_text


def refused(message: str) -> pytest.RaisesContext:
    return pytest.raises(GradscopeError, match=f"^{re.escape(message)}")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus of 60 paragraphs, K = 40: 36 train, 12 valid, 12 test."""
    root = tmp_path_factory.mktemp("lm-study")
    prepare_corpus(write_text(root / "raw.txt", 60, 0), root / "corpus", opts=CorpusOptions(vocab_size=40, valid=0.2, test=0.2))
    return root / "corpus"


def test_the_tiny_text_is_wikitext_style_one_paragraph_per_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Topics in name order, each a heading, its blank-line-separated blocks one line each; empty blocks dropped."""
    monkeypatch.setattr(pydoc_data.topics, "topics", {"b": "one\ntwo\n\n\n  three  \n\n", "a": "x"})
    assert tiny_raw_text() == "\n = a = \n\n x \n\n = b = \n\n one two \n three \n"


def test_the_tiny_text_is_this_pythons_help_topics() -> None:
    text = tiny_raw_text()
    assert text == tiny_raw_text()  # the same text on every call
    headings = [line for line in text.splitlines() if line.startswith(" = ")]
    assert headings == [f" = {name} = " for name in sorted(pydoc_data.topics.topics)]
    assert all("\n" not in line and "  " not in line for line in text.splitlines())


def test_each_scale_has_its_corpus_vocabulary() -> None:
    assert LM_SCALES == ("tiny", "paper")
    assert corpus_settings("tiny").vocab_size == 1024 and corpus_settings("paper").vocab_size == 32_768
    assert corpus_settings("tiny") == CorpusOptions(vocab_size=1024)  # the rest as corpus prepare's defaults
    with refused("scale: got 'huge'; valid scales are tiny, paper"):
        corpus_settings("huge")


def _record(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple, dict]]:
    calls: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(lm, "prepare_corpus", lambda *args, **kwargs: calls.append((args, kwargs)))
    return calls


def test_the_tiny_study_prepares_its_corpus_from_its_own_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pydoc_data.topics, "topics", {"a": "x y"})
    calls = _record(monkeypatch)
    root = tmp_path / "new" / "study"  # made as needed
    assert prepare_study_corpus("tiny", root) == root / "corpus"
    assert (root / "tiny_raw.txt").read_text(encoding="utf-8") == tiny_raw_text()
    [(args, kwargs)] = calls
    assert args == (root / "tiny_raw.txt", root / "corpus") and kwargs["opts"].vocab_size == 1024
    with refused("corpus_text: the tiny study builds its own corpus from pydoc_data/topics.py; leave it out"):
        prepare_study_corpus("tiny", tmp_path / "other", raw=tmp_path / "mine.txt")
    assert len(calls) == 1 and not (tmp_path / "other").exists()


def test_the_paper_study_needs_the_users_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _record(monkeypatch)
    with refused("corpus_text: the paper-scale lm study needs your WikiText-103 raw text (wiki.train.raw; "):
        prepare_study_corpus("paper", tmp_path)
    assert not calls
    raw, valid, test = (tmp_path / f"wiki.{s}.raw" for s in ("train", "valid", "test"))
    assert prepare_study_corpus("paper", tmp_path, raw, valid, test) == tmp_path / "corpus"
    [(args, kwargs)] = calls
    assert args == (raw, tmp_path / "corpus") and kwargs["opts"].vocab_size == 32_768
    assert (kwargs["valid_file"], kwargs["test_file"]) == (valid, test)  # the held-out splits as files of their own
    assert not (tmp_path / "tiny_raw.txt").exists()


def test_a_prepared_corpus_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _record(monkeypatch)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "manifest.json").write_text("{}")
    for scale in LM_SCALES:  # nothing is checked or prepared again, not even a raw text the tiny study refuses
        assert prepare_study_corpus(scale, tmp_path, raw=tmp_path / "mine.txt") == tmp_path / "corpus"
    assert not calls and not (tmp_path / "tiny_raw.txt").exists()


def test_the_tiny_lstm_on_a_corpus(corpus: Path) -> None:
    cfg = lm_base("tiny", corpus)
    c = open_corpus(corpus)
    assert (cfg.task.name, cfg.task.length, cfg.task.vocab_size) == ("lm", ROW_LENGTH["tiny"], 40) == ("lm", 128, 40)
    assert cfg.task.corpus == str(c.path) and cfg.task.corpus_sha256 == c.sha256 and cfg.task.distribution == "uniform"
    assert cfg.task.heldout_size == 12  # 256, capped at the valid split's paragraphs
    m, t = cfg.model, cfg.train
    assert (m.core, m.embed_size, m.hidden_size, m.vocab_size, m.max_len, m.pe) == ("lstm", 64, 128, 40, 128, "none")
    assert (t.iterations, t.batch_size, t.lr, t.warmup, t.checkpoint_every, t.log_every) == (2000, 32, 3e-3, 100, 500, 100)


def test_the_paper_lstm_on_a_corpus(corpus: Path) -> None:
    cfg = lm_base("paper", corpus)
    assert (cfg.task.length, cfg.task.heldout_size, cfg.task.vocab_size) == (ROW_LENGTH["paper"], 12, 40) == (1024, 12, 40)
    m, t = cfg.model, cfg.train
    assert (m.core, m.embed_size, m.hidden_size, m.vocab_size, m.max_len) == ("lstm", 512, 512, 40, 1024)
    assert (t.iterations, t.batch_size, t.lr, t.warmup, t.checkpoint_every) == (300_000, 512, 1e-3, 1000, 5000)


def test_the_runs_are_vanilla_and_pe_for_each_seed(corpus: Path) -> None:
    runs = plan_lm_runs("tiny", corpus, [3, 1])
    assert [r.name for r in runs] == ["lstm-none-s3", "lstm-none-s1", "lstm-sinusoidal-s3", "lstm-sinusoidal-s1"]
    assert [(r.config.model.pe, r.config.train.seed) for r in runs] == [(pe, s) for pe in PES for s in (3, 1)]
    base = lm_base("tiny", corpus)
    for r in runs:  # otherwise the scale's configuration
        assert r.config.task == base.task and r.config.train.iterations == base.train.iterations
        assert r.config.model.hidden_size == base.model.hidden_size


def test_fewer_iterations_scale_the_schedule(corpus: Path) -> None:
    t = plan_lm_runs("tiny", corpus, [1], iterations=40)[0].config.train
    assert (t.iterations, t.checkpoint_every, t.log_every, t.warmup) == (40, 10, 10, 4)  # 4 checkpoints, a tenth warm-up
    t = plan_lm_runs("paper", corpus, [1], iterations=3)[0].config.train
    assert (t.iterations, t.checkpoint_every, t.log_every, t.warmup) == (3, 1, 1, 0)
    t = plan_lm_runs("tiny", corpus, [1], iterations=4000)[0].config.train
    assert (t.checkpoint_every, t.log_every, t.warmup) == (1000, 100, 100)  # never above the scale's own


def test_the_runs_refuse_bad_seeds_and_iterations(corpus: Path) -> None:
    with refused("seeds: got []; give distinct seeds"):
        plan_lm_runs("tiny", corpus, [])
    with refused("seeds: got [2, 2]; give distinct seeds"):
        plan_lm_runs("tiny", corpus, [2, 2])
    with refused("seeds: got -1; it must be between 0 and"):
        plan_lm_runs("tiny", corpus, [-1])
    for bad in (0, -5):
        with refused(f"iterations: got {bad}; it must be positive"):
            plan_lm_runs("tiny", corpus, [1], iterations=bad)


def test_the_study_plan_prepares_nothing_before_it_checks_the_probes(tmp_path: Path, corpus: Path) -> None:
    from gradscope.workflows.study.lm import plan_lm_study
    from gradscope.workflows.study.options import StudyOptions
    with refused("probe_length: got 200; probes on this checkpoint take 2…128"):
        plan_lm_study(StudyOptions(study="lm", probe_length=200), tmp_path / "a")
    assert not (tmp_path / "a").exists()
    root = tmp_path / "b"
    (root / "corpus").parent.mkdir(parents=True)
    import shutil
    shutil.copytree(corpus, root / "corpus")  # a prepared corpus is used as it is
    runs, stability = plan_lm_study(StudyOptions(study="lm", seeds="7", iterations=4, target_pos=3, probe_length=9), root)
    assert [r.name for r in runs] == [f"lstm-{pe}-s7" for pe in PES]
    assert (stability.target_pos, stability.length) == (3, 9)
