"""The lm study's own options of `gradscope reproduce` (the paper's language-modelling appendix, docs/lm.md):
its corpus's raw files and its stability probes. Declared here once, with the study's name, what its help
says of the shared options and its rules; :class:`~gradscope.workflows.study.options.StudyOptions` takes
them as a base, and the study's plan (study/lm.py, one line in study/registry.py) reads them. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gradscope.errors import check
from gradscope.fields import option
from gradscope.workflows.options import PROBE_LENGTH, PROBE_TARGET_POS

LM_STUDY = "lm"


@dataclass(frozen=True, kw_only=True)
class LMStudyOptions:
    """``corpus_text`` (``valid_file``, ``test_file``): the paper scale's WikiText-103 raw files; ``target_pos``,
    ``probe_length``: the stability probes (None: paragraph token 16 of rows of 32; ``reproduce --text`` reads
    the same two flags)."""

    STUDY: ClassVar[str] = LM_STUDY
    ABOUT: ClassVar[str] = "the language-modelling appendix (LSTM vanilla vs PE on a text corpus, docs/lm.md)"
    # what the help of the shared options says of this study
    NOTES: ClassVar[dict[str, str]] = {
        "scale": "WikiText-103, SentencePiece 32,768, first 1,024 tokens per paragraph, 5 seeds",
        "models": "lstm, the paper's", "seeds": "111,222,333 tiny, 111–555 paper"}

    corpus_text: Path | None = option(None, f"--study {LM_STUDY} --scale paper: your WikiText-103 wiki.train.raw "
                                            "(nothing is downloaded).")
    valid_file: Path | None = option(None, f"--study {LM_STUDY} --scale paper: wiki.valid.raw.")
    test_file: Path | None = option(None, f"--study {LM_STUDY} --scale paper: wiki.test.raw.")
    target_pos: int | None = option(None, f"--study {LM_STUDY} or --text: the stability probes' target position "
                                          f"(paragraph token, 1-based; default {PROBE_TARGET_POS}).")
    probe_length: int | None = option(None, f"--study {LM_STUDY} or --text: the stability probe rows' length (start "
                                            f"token included; with --text, dynamics' rows too; default {PROBE_LENGTH}).")

    @staticmethod
    def check_study(opts: Any) -> None:
        """The rules between the study and its own options: the lm study trains the paper's LSTM; another study
        takes none of them."""
        if opts.study == LM_STUDY:
            check(opts.models is None or opts.models == ("lstm",),
                  f"models: got {', '.join(map(repr, opts.models or ()))}; the lm study trains the paper's LSTM only")
        else:
            check(opts.target_pos is None and opts.probe_length is None,
                  "target_pos/probe_length: they set the lm study's probes (study lm)")
            check(opts.corpus_text is None and opts.valid_file is None and opts.test_file is None,
                  "corpus_text/valid_file/test_file: they belong to the lm study (study lm)")
