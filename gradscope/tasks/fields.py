"""The fields of a task's configuration, with the checks that need no task registry. Every task class
reads its configuration through :class:`TaskFields`; :class:`~gradscope.tasks.config.TaskConfig` adds
the checks that look the task up in the registry (its name, and the settings only that task reads)."""

from __future__ import annotations

from dataclasses import dataclass

from gradscope.errors import check
from gradscope.fields import RARITY, bounded, check_fields, option, shown, text
from gradscope.models.config import MAX_SIZE

DISTRIBUTIONS = ("uniform", "dual")
MAX_LENGTH = 2**20  # a task's L (and copy's hold phase): the held-out grid is built position by position


@dataclass(frozen=True, kw_only=True)
class TaskFields:
    """A synthetic task's settings (docs/definitions.md §3). ``length`` is L (the maximum L for
    ``reverse-variable``; the number of tokens to remember for ``copy``). Build a
    :class:`~gradscope.tasks.config.TaskConfig`, which also checks them against the task registry."""

    # option(...): a setting of `gradscope train --<field>` (``name`` is --task) and of sweep specs
    name: str = option("reverse", "Task: a name in gradscope's task registry ({tasks}).", flag="task")
    vocab_size: int = option(64, "Vocabulary size K (copy: data tokens; blank and delimiter are added).", low=1,
                             high=MAX_SIZE)
    length: int = option(64, "Sequence length L (reverse-variable: the maximum).", low=1, high=MAX_LENGTH)
    min_length: int = option(32, "reverse-variable: the minimum L.", low=1, high=MAX_LENGTH)
    distribution: str = option("uniform", "Token distribution: uniform or dual (Frequent/Rare halves).")
    rarity: float = option(RARITY, "dual: probability that a position holds a Rare token.", low=0.0, high=1.0,
                           exclusive="both")
    heldout_size: int = option(1024, "Size of the uniform held-out test set.", low=1, high=MAX_SIZE)
    grid_per_cell: int = option(16, "dual reverse: held-out sequences per (target, disturbant, position).", low=1,
                                high=MAX_SIZE)
    hold_min: int = option(60, "copy: fewest blanks in the hold phase.", low=0, high=MAX_LENGTH)
    hold_max: int = option(100, "copy: most blanks in the hold phase.", low=0, high=MAX_LENGTH)
    dim: int = option(0, "A continuous task: tokens are points of the unit sphere S^(dim−1).", low=0, high=MAX_SIZE)
    # Vocabulary extension (paper §4.2): items 0 … old_items−1 are the pretrained ("old") ones and
    # old_items … K−1 the new ones (0: no split). new_item_share: the probability that a position
    # holds a new item (uniform within old and within new); None: uniform over all K items, as the
    # paper did, i.e. a share of (K − old_items)/K.
    old_items: int = bounded(0, low=0, high=MAX_SIZE)
    new_item_share: float | None = bounded(None, low=0.0, high=1.0, exclusive="both")  # both item kinds occur
    corpus: str = option("", "A corpus task: the corpus directory made by `gradscope corpus prepare` (its vocabulary sets K).")
    corpus_sha256: str = ""  # a corpus task: the sha256 of that corpus's manifest (its identity)

    def __post_init__(self) -> None:
        text("distribution", self.distribution, DISTRIBUTIONS)
        check_fields(self, strict=True)  # the ranges declared on the fields
        check(self.vocab_size >= 2, f"vocab_size: got {self.vocab_size}; need at least 2 tokens")
        check(self.old_items < self.vocab_size,
              f"old_items: got {self.old_items}; an extended vocabulary of {self.vocab_size} items needs fewer old ones")
        if self.new_item_share is not None:
            check(self.old_items > 0, "new_item_share: only an extended vocabulary (old_items > 0) has new items")
            check(self.distribution == "uniform",
                  f"new_item_share: the {self.distribution} distribution has its own item frequencies; use "
                  f"the uniform one to set the share of new items")
        for name in ("corpus", "corpus_sha256"):
            check(isinstance(getattr(self, name), str), f"{name}: got {shown(getattr(self, name))}; expected text")
