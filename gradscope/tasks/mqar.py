"""``mqar``: multi-query associative recall (as in the Zoology benchmark, Arora et al. 2023), with
dual-frequency keys.

A row holds P = L/2 key–value pairs, then P queries, each a key of the row, whose value must be
recalled::

    inputs  = k_1 v_1 k_2 v_2 … k_P v_P | q_1 K q_2 K … q_P K        (T = 2L; K = the query token)
    targets = IGNORE …                   | v(q_1) · v(q_2) · …          (scored at each query key)

Keys are P distinct tokens drawn without replacement from the task's vocabulary distribution (dual:
the upper half of the ids is rare, ``rarity`` being the chance that one draw is rare), values are
uniform over the K tokens, and the queries ask every key once, in a random order. Accuracy is
conditioned on the key's frequency group and on the distance between a pair and its query (the
query key's position minus the pair key's: 2 … 2L − 2), in at most four bins of equal width. A uniform
vocabulary has no frequency groups: its keys are split into the lower and upper half of the ids, and the
groups are named so (``lower-ids``, ``upper-ids``), never "frequent" and "rare".
"""

from __future__ import annotations

import math
from typing import ClassVar, Mapping, Sequence

import numpy as np
import torch

from gradscope.errors import check
from gradscope.tasks.base import IGNORE, Batch, Task
from gradscope.tasks.family import (COUNT, FLOAT, INT, STR, Metrics, Panel, Part, ReportSection, Variable, ratio,
                                    stack, units)
from gradscope.tasks.fields import TaskFields
from gradscope.tasks.vocab import GROUP_NAMES, RARE, group_bounds, token_weights

MAX_BINS = 4
# a uniform vocabulary has no frequency groups: its keys are split by id, and named for it
UNIFORM_GROUPS = ("lower-ids", "upper-ids")


def distance_bins(length: int) -> list[tuple[int, int]]:
    """Inclusive [first, last] distance of each bin: the even distances 2 … 2L − 2 in at most
    :data:`MAX_BINS` bins of (nearly) equal count."""
    distances = np.arange(2, 2 * length - 1, 2)
    return [(int(d[0]), int(d[-1])) for d in np.array_split(distances, min(MAX_BINS, distances.size))]


class MQAR(Task):
    name: ClassVar[str] = "mqar"
    settings: ClassVar[tuple[str, ...]] = ("distribution", "rarity")
    probes: ClassVar[bool] = True  # the shared token probes: L tokens of the target/disturbant groups, then queries
    tiny = {"distribution": "dual"}
    layout = {
        "recall_accuracy": Variable(dims=("checkpoint", "key_group", "distance"), kind=FLOAT,
                                    help="accuracy of the recalled value by the key's group and the pair–query distance"),
        "recall_n": Variable(dims=("key_group", "distance"), kind=COUNT, help="queries per cell"),
        "key_accuracy": Variable(dims=("checkpoint", "key_group"), kind=FLOAT, help="accuracy by the key's group"),
        "key_group": Variable(dims=("key_group",), kind=STR, help="frequent, rare (a uniform vocabulary: lower-ids, upper-ids)"),
        "distance": Variable(dims=("distance",), kind=STR, help="the distance bin, as first–last"),
        "distance_start": Variable(dims=("distance",), kind=INT, help="first distance of the bin"),
        "distance_end": Variable(dims=("distance",), kind=INT, help="last distance of the bin"),
    }
    needs = {"key_group": ("key_group",), "distance": ("distance", "distance_start", "distance_end")}
    report = ReportSection(
        heading="Associative recall (MQAR): accuracy by key frequency and distance",
        text="Accuracy of the recalled value against the distance between a key–value pair and its query, "
             "after frequent keys (solid) and rare keys (dashed). Lines: mean over seeds; bars: lowest to "
             "highest seed.",
        panels=(Panel(variable="recall_accuracy", x="distance", split="key_group",
                      title="by pair–query distance", x_title="distance (positions)"),))

    @classmethod
    def check_config(cls, cfg: TaskFields) -> None:
        check(cfg.length >= 2 and cfg.length % 2 == 0,
              f"length: got {cfg.length}; an mqar row holds length/2 key–value pairs, so length must be even and ≥ 2")
        check(cfg.length // 2 <= cfg.vocab_size,
              f"length: got {cfg.length}; its {cfg.length // 2} keys must be distinct tokens, but the vocabulary "
              f"has {cfg.vocab_size} (raise vocab_size or lower length)")

    @property
    def pairs(self) -> int:
        return self.cfg.length // 2

    def n_patterns(self) -> int:
        k, p = self.cfg.vocab_size, self.pairs
        return math.perm(k, p) * k ** p * math.factorial(p)

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        k, p, device = self.cfg.vocab_size, self.pairs, gen.device
        weights = token_weights(k, self.cfg.distribution, self.cfg.rarity).to(device)
        keys = torch.multinomial(weights.expand(n, k), p, replacement=False, generator=gen)  # (n, P) distinct
        values = torch.randint(0, k, (n, p), generator=gen, device=device)
        order = torch.rand(n, p, generator=gen, device=device).argsort(1)  # the pair each query asks
        inputs = self.full(n, 2 * self.cfg.length, self.query, keys)
        targets = self.full(n, 2 * self.cfg.length, IGNORE, keys)
        inputs[:, 0:self.cfg.length:2], inputs[:, 1:self.cfg.length:2] = keys, values
        inputs[:, self.cfg.length::2] = keys.gather(1, order)
        targets[:, self.cfg.length::2] = values.gather(1, order)
        return Batch(inputs, targets)

    def score(self, batch: Batch, preds: torch.Tensor) -> dict[str, np.ndarray]:
        """Right and asked queries per (key group, distance bin)."""
        length = self.cfg.length
        bins = distance_bins(length)
        keys, asked = batch.inputs[:, 0:length:2], batch.inputs[:, length::2]  # (n, P) each
        pair = (asked[:, :, None] == keys[:, None, :]).int().argmax(-1)  # the pair each query asks
        distance = length + 2 * torch.arange(self.pairs) - 2 * pair  # (n, P)
        low = torch.tensor([a for a, _ in bins])
        cell = (asked >= group_bounds(self.cfg.vocab_size, RARE)[0]).long() * len(bins) \
            + torch.bucketize(distance, low, right=True) - 1
        right = preds[:, length::2] == batch.targets[:, length::2]
        size = len(GROUP_NAMES) * len(bins)
        groups = GROUP_NAMES if self.cfg.distribution == "dual" else UNIFORM_GROUPS
        return {"correct": torch.bincount(cell[right], minlength=size).reshape(len(GROUP_NAMES), -1).numpy(),
                "total": torch.bincount(cell.flatten(), minlength=size).reshape(len(GROUP_NAMES), -1).numpy(),
                "edges": np.array(bins), "groups": np.asarray(groups, dtype=object)}

    @classmethod
    def accuracy_part(cls, counts: Sequence[Mapping[str, np.ndarray]]) -> tuple[Part, Part]:
        correct, total = stack(counts, "correct"), stack(counts, "total")  # (C, 2, bins)
        edges = counts[0]["edges"]  # (bins, 2)
        return ({"recall_accuracy": (("checkpoint", "key_group", "distance"), ratio(correct, total)),
                 "recall_n": (("key_group", "distance"), total[0]),
                 "key_accuracy": (("checkpoint", "key_group"), ratio(correct.sum(-1), total.sum(-1)))},
                {"key_group": np.asarray(counts[0].get("groups", GROUP_NAMES), dtype=object),
                 "distance": np.asarray([f"{a}–{b}" for a, b in edges], dtype=object),
                 "distance_start": ("distance", edges[:, 0].copy()), "distance_end": ("distance", edges[:, 1].copy())})

    @classmethod
    def summary_metrics(cls, last: Mapping[str, np.ndarray]) -> Metrics:
        """recall/<group> (units: 1/0 per query) and recall/<group>/d<first>-<last> per distance bin."""
        metrics: dict[str, float] = {}
        per_unit: dict[str, np.ndarray] = {}
        n = last["recall_n"]
        for g, group in enumerate(last["key_group"]):
            right = int(np.rint(np.nan_to_num(last["recall_accuracy"][g]) * n[g]).sum())
            metrics[f"recall/{group}"] = float(last["key_accuracy"][g])
            per_unit[f"recall/{group}"] = units(right, int(n[g].sum()))
            for b, (a, e) in enumerate(zip(last["distance_start"], last["distance_end"])):
                metrics[f"recall/{group}/d{a}-{e}"] = float(last["recall_accuracy"][g, b])
        return metrics, per_unit

    @classmethod
    def lines(cls, last: Mapping[str, np.ndarray]) -> list[str]:
        out = []
        for g, group in enumerate(last["key_group"]):
            cells = ", ".join(f"{d}: {a:.3f}" for d, a in zip(last["distance"], last["recall_accuracy"][g]))
            out.append(f"recall after {group} keys: {last['key_accuracy'][g]:.3f} ({int(last['recall_n'][g].sum())} "
                       f"queries); by pair–query distance {cells}")
        return out
