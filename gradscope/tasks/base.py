"""What every task provides, and the batch type it produces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping, Sequence, TypeVar

import numpy as np
import torch

from gradscope.tasks.family import Metrics, Part, ReportSection, Variable
from gradscope.tasks.fields import TaskFields
from gradscope.tasks.vocab import sample_tokens

# TaskConfig fields that only some tasks read (each task's ``settings``); the others (name, vocab_size,
# length, heldout_size and the extension's fields) every task has.
OPTIONAL_SETTINGS = ("distribution", "rarity", "grid_per_cell", "min_length", "hold_min", "hold_max", "dim", "corpus")
IGNORE = -100  # target value of unscored positions (cross-entropy ignore_index)
Cfg = TypeVar("Cfg", bound=TaskFields)  # a task's configuration: a TaskConfig (or its fields alone)


@dataclass(frozen=True)
class Batch:
    """inputs (B, T) token ids (query token = K); targets (B, T), IGNORE where unscored."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def select(self, index: torch.Tensor) -> "Batch":
        return Batch(self.inputs[index], self.targets[index])

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(self.inputs.to(device), self.targets.to(device))


class Task:
    """A synthetic task. Subclasses implement ``sample`` and ``n_patterns``; sampling is vectorised
    on the generator's device.

    ``num_classes`` is K for the model (the logits width); the query token id is K.

    A task family is one file with its class and one line in :mod:`gradscope.tasks.registry`; the
    class declares its registry ``name``, whether stability/dynamics probes are defined on it
    (``probes``: an input phase followed by query tokens, docs/definitions.md §5), the checks of the
    :class:`~gradscope.config.TaskConfig` fields it alone uses (``check_config``), and its own part
    of the accuracy store, summary and report (:mod:`gradscope.tasks.family`).
    """

    name: ClassVar[str] = "task"
    probes: ClassVar[bool] = False
    inputs: ClassVar[str] = "tokens"  # what a position holds: token ids, or vectors (the continuous task)
    # rows of unequal length padded to one: training's throughput counts the scored tokens, not the positions
    padded_rows: ClassVar[bool] = False
    disjoint_heldout: ClassVar[bool] = False  # held-out rows come from their own split: nothing to exclude
    default_length: ClassVar[int | None] = None  # L when none is given (None: the preset's)
    # The optional TaskConfig fields (:data:`OPTIONAL_SETTINGS`) this task reads; a given option
    # setting any other is refused, not recorded and ignored. Token tasks draw their tokens from the
    # uniform or dual distribution (rarity: dual only).
    settings: ClassVar[tuple[str, ...]] = ("distribution", "rarity")
    # whether its accuracy store holds the token part (token, sequence and DL accuracy, the grid) beside
    # its own; False: its own part alone (reverse-continuous: cosine similarity). How a checkpoint is
    # evaluated needs the model and the analysis layer, so it is declared above this layer:
    # gradscope.workflows.families (default: argmax on the held-out set, then ``score``)
    token_part: ClassVar[bool] = True
    # the family's own part of an accuracy store (gradscope.tasks.family): variable → dims and kind;
    # the dims that need coordinates looked up by readers; the report section drawn from them
    # the family's own TaskConfig settings for a small run (the shared contract, tests/helpers/contracts.py,
    # trains one with them); None: a small run needs data the contract cannot make (lm: a corpus)
    tiny: ClassVar[Mapping[str, object] | None] = {}
    layout: ClassVar[Mapping[str, Variable]] = {}
    needs: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    report: ClassVar[ReportSection | None] = None

    @classmethod
    def check_config(cls, cfg: TaskFields) -> None:
        """Refuse (GradscopeError) settings this task cannot run with; TaskConfig calls it once its
        shared fields are checked."""

    @classmethod
    def resolve(cls, cfg: Cfg) -> Cfg:
        """``cfg`` completed from what the task reads (a corpus's vocabulary); most tasks: as it is."""
        return cfg

    def __init__(self, cfg: TaskFields) -> None:
        self.cfg = cfg

    @property
    def num_classes(self) -> int:
        return self.cfg.vocab_size

    @property
    def query(self) -> int:
        return self.num_classes

    @property
    def total_len(self) -> int:
        """T: padded length of every input row."""
        return 2 * self.cfg.length

    def n_patterns(self) -> int:
        """How many distinct input rows the task can produce (exact, arbitrary precision)."""
        raise NotImplementedError

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        raise NotImplementedError

    def heldout_batch(self) -> Batch | None:
        """A fixed held-out set of the task's own (lm: valid paragraphs), or None to draw one."""
        return None

    # --- the probe source (stability, dynamics): token ids of an input phase, then query tokens ---

    @property
    def probe_ids(self) -> int:
        """How many probe token ids the task's models read (ids ≥ this are the query token)."""
        return self.cfg.vocab_size

    def probed(self, model: torch.nn.Module, seed: int) -> torch.nn.Module:
        """``model`` as the probes see it: a model that reads token ids, as it is."""
        return model

    def probe_classes(self, tokens: torch.Tensor, query: int) -> np.ndarray:
        """The class of each probe id (dynamics groups steps by it): 'frequent' ([0, K/2)), 'rare'
        ([K/2, K)) or 'query' (docs/definitions.md §3's dual vocabulary)."""
        t = tokens.numpy()
        out = np.where(t < self.cfg.vocab_size // 2, "frequent", "rare").astype(object)
        out[t == query] = "query"
        return out

    # --- how the family is trained, and scored while training ---

    @classmethod
    def objective(cls, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The training objective on the model's ``outputs`` for a batch's ``targets``: (mean loss over the
        scored positions, # right (a family of point predictions: the sum of its score), # scored). Token
        families: cross-entropy of the logits (B, T, K), targets IGNORE where unscored."""
        loss = torch.nn.functional.cross_entropy(outputs.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        scored = targets != IGNORE
        correct = ((outputs.argmax(-1) == targets) & scored).sum()
        return loss, correct, scored.sum()

    @classmethod
    def heldout_scores(cls, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        """A family whose positions hold vectors (``inputs`` "vectors": point predictions): its scores of the
        model's ``outputs`` on the uniform held-out set, as the run's evaluation records them (a token family
        is scored by argmax: token and sequence accuracy, the grid, in :func:`gradscope.train.evaluate_heldout`)."""
        raise NotImplementedError(f"{cls.name}: a family of vector positions declares its held-out scores")

    # --- the family's own part of the accuracy store (gradscope.tasks.family) ---

    def score(self, batch: Batch, preds: torch.Tensor) -> dict[str, np.ndarray]:
        """This family's counts for one checkpoint, from ``preds`` (n, T), the argmax predictions on
        its held-out ``batch`` (none by default)."""
        return {}

    @classmethod
    def accuracy_part(cls, counts: Sequence[Mapping[str, np.ndarray]]) -> tuple[Part, Part]:
        """The family's store variables and coordinates (as xarray takes them) from every checkpoint's
        :meth:`score`, in checkpoint order; every name is declared in ``layout``."""
        return {}, {}

    @classmethod
    def summary_metrics(cls, last: Mapping[str, np.ndarray]) -> Metrics:
        """Metrics read by `gradscope summarize`, and their units for bootstrap intervals, from the
        family's stored variables at the last checkpoint (``last``: name → values, coordinates too)."""
        return {}, {}

    @classmethod
    def lines(cls, last: Mapping[str, np.ndarray]) -> list[str]:
        """What `gradscope accuracy` prints of the family's variables at the last checkpoint."""
        return []

    def tokens(self, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        """Tokens from this task's vocabulary distribution (with ``new_item_share`` set: new items
        [old_items, K) with that probability, else old ones [0, old_items), uniform within each)."""
        cfg = self.cfg
        share = cfg.new_item_share
        if share is None:
            return sample_tokens(shape, cfg.vocab_size, cfg.distribution, cfg.rarity, gen)
        new = torch.rand(shape, generator=gen, device=gen.device) < share
        old_tok = torch.randint(0, cfg.old_items, shape, generator=gen, device=gen.device)
        new_tok = torch.randint(cfg.old_items, cfg.vocab_size, shape, generator=gen, device=gen.device)
        return torch.where(new, new_tok, old_tok)

    def full(self, n: int, length: int, value: int, like: torch.Tensor) -> torch.Tensor:
        return torch.full((n, length), value, dtype=torch.long, device=like.device)
