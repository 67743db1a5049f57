"""The lm family's own option of `stability`, `dynamics` and `accuracy`: the directory its corpus lies in
now. Declared here once; each command's options take it through
:class:`~gradscope.workflows.families.options.FamilyOptions`, and the family's evaluation and probe source
(families/lm.py) read it. Torch-free, so that ``--help`` does not load torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gradscope.fields import as_path, option

CORPUS_HELP = ("Checkpoints trained on a corpus: its directory, if it moved since training (its manifest must match "
               "the run's).")


@dataclass(frozen=True, kw_only=True)
class LMOptions:
    """``corpus``: the directory of the corpus a checkpoint trained on, where it moved since training (None: the
    recorded one). Given for a checkpoint of another family, or for a source without one, it is refused."""

    corpus: Path | None = option(None, CORPUS_HELP)

    def __post_init__(self) -> None:
        as_path(self, "corpus")
