"""`gradscope reproduce --study lm`: the paper's language-modelling appendix (E), at two scales.

- ``paper``: WikiText-103 as the study used it: the user's raw file(s) (nothing is downloaded),
  SentencePiece vocabulary 32,768, headings removed, one paragraph per line, the first 1,024 tokens
  of each paragraph, a single-layer LSTM (E = H = 512) vanilla and with sinusoidal PE, docs/definitions.md §3's
  optimisation (Adam, lr 1e-3 warmed up over 1,000 iterations then cosine, batch 512, 300k
  iterations), seeds 111–555. The paper's test perplexities (5 seeds): vanilla 37.77
  (36.83–38.92), PE 38.54 (38.07–38.89).
- ``tiny``: minutes per run on a 2-core CPU, on a corpus built from text every CPython install has on
  disk: ``pydoc_data/topics.py`` (the help topics of the Python documentation, part of CPython,
  distributed under the PSF License Agreement). Each topic becomes a WikiText-style heading
  `` = name = `` followed by its paragraphs (blank-line-separated blocks, each joined to one line);
  vocabulary 1,024, the first 128 tokens per paragraph, LSTM E = 64, H = 128, 2,000 iterations of
  batch 32 (lr 3e-3, warm-up 100).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pydoc_data.topics

from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.corpus import open_corpus
from gradscope.workflows.corpus import CorpusOptions, prepare_corpus
from gradscope.corpus.store import MANIFEST
from gradscope.errors import check
from gradscope.tasks.lm import LanguageModel
from gradscope.workflows.families.lm import check_probe_shape
from gradscope.workflows.options import PROBE_LENGTH, PROBE_TARGET_POS, StabilityOptions
from gradscope.workflows.study.options import StudyOptions
from gradscope.workflows.study.runs import PES, PlannedRun
from gradscope.fields import as_seed

LM_SCALES = ("tiny", "paper")
PAPER_SEEDS = (111, 222, 333, 444, 555)
TINY_SOURCE = "pydoc_data/topics.py (CPython's documentation help topics; PSF License Agreement)"


def tiny_raw_text() -> str:
    """The tiny corpus's raw text, WikiText-style, from this Python's ``pydoc_data.topics``."""
    lines = []
    for name, body in sorted(pydoc_data.topics.topics.items()):
        lines += ["", f" = {name} = ", ""]
        for block in body.split("\n\n"):
            text = " ".join(block.split())
            if text:
                lines.append(f" {text} ")
    return "\n".join(lines) + "\n"


def corpus_settings(scale: str) -> CorpusOptions:
    check(scale in LM_SCALES, f"scale: got {scale!r}; valid scales are {', '.join(LM_SCALES)}")
    return CorpusOptions(vocab_size=1024) if scale == "tiny" else CorpusOptions(vocab_size=32_768)


def prepare_study_corpus(scale: str, root: Path, raw: Path | None = None, valid_file: Path | None = None,
                         test_file: Path | None = None) -> Path:
    """The study's corpus directory ``root/corpus``, prepared unless it exists: ``tiny`` from
    :func:`tiny_raw_text` (written to ``root/tiny_raw.txt``); ``paper`` from the user's ``raw``
    (WikiText-103's wiki.train.raw, with wiki.valid.raw and wiki.test.raw as the held-out splits)."""
    out = root / "corpus"
    if (out / MANIFEST).is_file():
        return out
    if scale == "tiny":
        check(raw is None, "corpus_text: the tiny study builds its own corpus from pydoc_data/topics.py; leave it out")
        raw = root / "tiny_raw.txt"
        root.mkdir(parents=True, exist_ok=True)
        raw.write_text(tiny_raw_text(), encoding="utf-8")
    else:
        check(raw is not None, "corpus_text: the paper-scale lm study needs your WikiText-103 raw text (wiki.train.raw; "
                               "with valid_file and test_file for wiki.valid.raw and wiki.test.raw); nothing is "
                               "downloaded")
    prepare_corpus(raw, out, opts=corpus_settings(scale), valid_file=valid_file, test_file=test_file)
    return out


ROW_LENGTH = {"tiny": 128, "paper": 1024}  # tokens per paragraph row (the paper: the first 1,024)


def lm_base(scale: str, corpus: Path) -> RunConfig:
    """The vanilla LSTM of the study at ``scale`` on ``corpus``."""
    c = open_corpus(corpus)
    if scale == "tiny":
        task = TaskConfig(name="lm", length=ROW_LENGTH[scale], heldout_size=256, corpus=str(c.path))  # capped at the valid split
        model = ModelConfig(core="lstm", embed_size=64, hidden_size=128)
        train = TrainConfig(iterations=2000, batch_size=32, lr=3e-3, warmup=100, checkpoint_every=500, log_every=100)
    else:
        task = TaskConfig(name="lm", length=ROW_LENGTH[scale], heldout_size=512, corpus=str(c.path))
        model = ModelConfig(core="lstm", embed_size=512, hidden_size=512)
        train = TrainConfig(iterations=300_000, batch_size=512, lr=1e-3, warmup=1000, checkpoint_every=5000)
    task = LanguageModel.resolve(task)
    model = dataclasses.replace(model, vocab_size=task.vocab_size, max_len=task.length)
    return RunConfig(model=model, task=task, train=train)


def plan_lm_runs(scale: str, corpus: Path, seeds: list[int], iterations: int | None = None) -> list[PlannedRun]:
    """Vanilla and sinusoidal-PE LSTM × ``seeds`` on ``corpus``."""
    check(bool(seeds) and len(set(seeds)) == len(seeds), f"seeds: got {seeds}; give distinct seeds")
    base = lm_base(scale, corpus)
    train = base.train
    if iterations is not None:
        check(iterations > 0, f"iterations: got {iterations}; it must be positive")
        every = max(1, iterations // 4)
        train = dataclasses.replace(train, iterations=iterations, checkpoint_every=every,
                                    log_every=max(1, min(train.log_every, every)), warmup=min(train.warmup, iterations // 10))
    return [PlannedRun(f"lstm-{pe}-s{seed}", dataclasses.replace(
                base, model=dataclasses.replace(base.model, pe=pe),
                train=dataclasses.replace(train, seed=as_seed(seed, "seeds"))))
            for pe in PES for seed in seeds]


def plan_lm_study(options: StudyOptions, out: Path) -> tuple[list[PlannedRun], StabilityOptions]:
    """The lm study's runs (vanilla and PE LSTM × ``options.seeds``, by default 111, 222, 333 tiny and 111–555
    paper) and the stability options they share (probes at ``options.target_pos`` of rows of
    ``options.probe_length``). Its corpus is prepared first, under ``out`` (its vocabulary sizes the runs);
    the probes' shape is checked before that."""
    target_pos = PROBE_TARGET_POS if options.target_pos is None else options.target_pos
    length = PROBE_LENGTH if options.probe_length is None else options.probe_length
    stability = StabilityOptions(triplets=options.triplets, target_pos=target_pos, length=length)
    if options.scale in ROW_LENGTH:  # before any work (an unknown scale is refused where the corpus is made)
        check_probe_shape(target_pos, length, ROW_LENGTH[options.scale], "probe_length")
    corpus = prepare_study_corpus(options.scale, out, options.corpus_text, options.valid_file, options.test_file)
    seeds = options.seeds or ((111, 222, 333) if options.scale == "tiny" else tuple(PAPER_SEEDS))
    return plan_lm_runs(options.scale, corpus, list(seeds), options.iterations), stability
