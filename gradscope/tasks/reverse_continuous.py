"""``reverse-continuous`` (paper App. B.3, the "infinite" vocabulary): x_1…x_L ↦ x_L…x_1 where each
token is a point drawn uniformly on the unit sphere S^(d−1) of R^d (d = ``dim``).

A position holds a vector, so a batch is float: inputs (n, 2L, d + 1) — the token's d coordinates
and a query flag, 1 in the output phase (where the coordinates are 0); targets (n, 2L, d) — the
vector to reproduce, NaN where unscored (the input phase). The model reads it through a linear
projection (``ModelConfig(inputs="vectors")``) and predicts a point, trained to maximise the
cosine similarity with the target. There is one frequency class (every point is as likely);
held-out sequences are not excluded from training, as a repeat of a continuous draw has
probability 0.
"""

from __future__ import annotations

from typing import ClassVar, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from gradscope.errors import check
from gradscope.tasks.base import Batch, Task
from gradscope.tasks.family import FLOAT, INT, Metrics, Panel, Part, ReportSection, Variable, stack
from gradscope.tasks.fields import TaskFields


def sphere_points(shape: tuple[int, ...], dim: int, gen: torch.Generator) -> torch.Tensor:
    """Points uniform on S^(dim−1): normalised standard normal draws, (*shape, dim) float32."""
    x = torch.randn((*shape, dim), generator=gen, device=gen.device)
    return x / x.norm(dim=-1, keepdim=True)


class ReverseContinuous(Task):
    name: ClassVar[str] = "reverse-continuous"
    settings: ClassVar[tuple[str, ...]] = ("dim",)  # points of a sphere: one frequency class
    probes: ClassVar[bool] = True
    inputs: ClassVar[str] = "vectors"
    tiny = {"dim": 3}
    # its accuracy store is its own part alone: the cosine similarity of point predictions and targets
    # on the held-out set (evaluated by gradscope.workflows.families.reverse_continuous), per checkpoint,
    # per scored output time (1-based) with a bootstrap interval over sequences, and per sequence
    token_part: ClassVar[bool] = False
    layout = {"cosine_similarity": Variable(dims=("checkpoint",), kind=FLOAT),
              "position_cosine": Variable(dims=("checkpoint", "time"), kind=FLOAT),
              "position_cosine_low": Variable(dims=("checkpoint", "time"), kind=FLOAT),
              "position_cosine_high": Variable(dims=("checkpoint", "time"), kind=FLOAT),
              "sequence_cosine": Variable(dims=("checkpoint", "sequence"), kind=FLOAT),
              "time": Variable(dims=("time",), kind=INT)}
    report = ReportSection(
        heading="Continuous vocabulary: cosine similarity per position",
        text="Mean cosine similarity of prediction and target per output time (docs/experiments.md). Lines: mean "
             "over seeds; bars: lowest to highest seed (a single store: its 95% bootstrap CI).",
        panels=(Panel(variable="position_cosine", x="time", bounds=("position_cosine_low", "position_cosine_high"),
                      title="per output time", x_title="time step (output phase)", y_title="mean cosine similarity"),))

    @classmethod
    def objective(cls, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Trained to maximise the cosine similarity of point predictions (B, T, d) and targets (NaN where
        unscored): (mean 1 − cosine similarity, sum of cosine similarities, # scored)."""
        cos, scored = _scored_cosines(outputs, targets)
        return (1 - cos).mean(), cos.detach().sum(), scored

    @classmethod
    def heldout_scores(cls, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        """The mean cosine similarity of point predictions and targets over the scored positions."""
        return {"cosine_similarity": float(_scored_cosines(outputs, targets)[0].double().mean())}

    @classmethod
    def accuracy_part(cls, counts: Sequence[Mapping[str, np.ndarray]]) -> tuple[Part, Part]:
        """Its store from each checkpoint's ``cosine`` (n, T) float64 (NaN where unscored), the scored
        ``times`` (0-based) and the ``mean``, ``low`` and ``high`` of each scored time's interval: the
        mean over every scored position, per time with its interval, and per sequence (the mean of its
        scored positions)."""
        counts = list(counts)
        data: Part = {
            "cosine_similarity": ("checkpoint", np.array([_mean_scored(c["cosine"]) for c in counts])),
            "position_cosine": (("checkpoint", "time"), stack(counts, "mean")),
            "position_cosine_low": (("checkpoint", "time"), stack(counts, "low")),
            "position_cosine_high": (("checkpoint", "time"), stack(counts, "high")),
            "sequence_cosine": (("checkpoint", "sequence"), np.stack([_sequence_means(c["cosine"]) for c in counts])),
        }
        return data, {"sequence": np.arange(counts[0]["cosine"].shape[0]), "time": counts[0]["times"] + 1}

    @classmethod
    def summary_metrics(cls, last: Mapping[str, np.ndarray]) -> Metrics:
        """Mean cosine similarity (units: each held-out sequence's mean over its scored positions) and
        the mean per output time."""
        metrics = {"cosine_similarity": float(last["cosine_similarity"])}
        for t, value in zip(last["time"], last["position_cosine"]):
            metrics[f"cosine/t{int(t)}"] = float(value)
        return metrics, {"cosine_similarity": np.asarray(last["sequence_cosine"]).astype(float)}

    @classmethod
    def lines(cls, last: Mapping[str, np.ndarray]) -> list[str]:
        """Mean cosine similarity per output time with its bootstrap interval."""
        head = (f"held-out cosine similarity (mean over all scored positions {float(last['cosine_similarity']):.4f}; "
                f"95% bootstrap CI over {np.asarray(last['sequence_cosine']).size} sequences)")
        rows = [f"  {'time':>4} {'mean cosine':>12}  95% CI"]
        rows += [f"  {int(t):>4} {m:>12.4f}  [{lo:.4f}, {hi:.4f}]" for t, m, lo, hi in
                 zip(last["time"], last["position_cosine"], last["position_cosine_low"], last["position_cosine_high"])]
        return [head, *rows]

    # its probe source: ids into a seeded table of sphere points (see "Probes" below)
    @property
    def probe_ids(self) -> int:
        return TABLE_SIZE

    def probed(self, model: nn.Module, seed: int) -> nn.Module:
        return vector_probe_model(model, seed)

    def probe_classes(self, tokens: torch.Tensor, query: int) -> np.ndarray:
        """One frequency class: every point of the sphere is as likely."""
        return np.where(tokens.numpy() == query, "query", "point").astype(object)

    @classmethod
    def check_config(cls, cfg: TaskFields) -> None:
        check(cfg.dim >= 2, f"dim: got {cfg.dim}; reverse-continuous draws tokens from the sphere S^(dim−1) "
                            f"and needs dim >= 2 (--dim)")
        check(cfg.distribution == "uniform",
              f"distribution: got {cfg.distribution!r}; reverse-continuous has one frequency class (uniform)")
        check(cfg.old_items == 0, "old_items: reverse-continuous has no vocabulary to extend")

    @property
    def num_classes(self) -> int:
        """The width d of a token (and of the model's prediction)."""
        return self.cfg.dim

    def n_patterns(self) -> int:
        return 2 ** 64  # a continuum; the bound only serves the held-out capacity check

    def format(self, x: torch.Tensor) -> Batch:
        """Vectors x (n, L, d) → inputs (n, 2L, d + 1) and targets (n, 2L, d) (NaN where unscored)."""
        n, length, d = x.shape
        query = torch.zeros(n, length, d + 1, dtype=x.dtype, device=x.device)
        query[..., d] = 1.0
        inputs = torch.cat([torch.cat([x, x.new_zeros(n, length, 1)], dim=-1), query], dim=1)
        targets = torch.cat([torch.full_like(x, float("nan")), x.flip(1)], dim=1)
        return Batch(inputs, targets)

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        return self.format(sphere_points((n, self.cfg.length), self.cfg.dim, gen))


def _scored_cosines(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cosine similarity of each scored point prediction (B, T, d) with its target (NaN where unscored), and
    the number scored."""
    scored = ~targets[..., 0].isnan()  # (B, T)
    return torch.nn.functional.cosine_similarity(outputs[scored], targets[scored], dim=-1), scored.sum()


def _mean_scored(cosine: np.ndarray) -> float:
    """The mean over every scored (finite) entry of ``cosine`` (n, T); NaN when none is."""
    values = cosine[np.isfinite(cosine)]
    return float(values.mean()) if values.size else float("nan")


def _sequence_means(cosine: np.ndarray) -> np.ndarray:
    """The mean over each sequence's scored positions of ``cosine`` (n, T) → (n,)."""
    scored = np.isfinite(cosine)
    with np.errstate(invalid="ignore"):
        return np.where(scored, cosine, 0.0).sum(1) / scored.sum(1)


# --- Probes --------------------------------------------------------------------------------------
# Gradient-stability probes of this family.
#
# The probe machinery (docs/definitions.md §4) builds triplets of token ids. For a model that reads vectors, the
# ids index a fixed table of M points drawn uniformly on the sphere S^(d−1) (seeded), and id M is the
# query: :class:`VectorProbeModel` maps ids to the model's vector inputs and leaves everything else
# (core, PE, readout) to the model. With the table, the probe definitions carry over unchanged:
#
# - the *target* is the vector read at position p; the *disturbants* are the vectors at every other
#   input position (prefix and suffix);
# - base = (P, x, S), same-target = (P, x, S′) (new suffix vectors), same-suffix = (P′, x′, S) (a
#   new target vector and prefix);
# - there is one frequency class: every point of the sphere is as likely, so the only condition is
#   all/all (target group ``all``, disturbant group ``all``).
#
# With M = 4096 points a probe draws L vectors out of 4096, so a repeat within a triplet is rare
# but possible, as repeats are (with probability 0) not in the task; the table is a function of
# the seed, so the probes are reproducible.

TABLE_SIZE = 4096  # points of the sphere the probe ids index


class VectorProbeModel(nn.Module):
    """A vector-input :class:`~gradscope.models.seq.SeqModel` seen through token ids: id i < M reads
    ``table[i]`` (a point of S^(d−1)), id M (``query_token``) the query flag."""

    def __init__(self, model: nn.Module, table: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.core = model.core
        self.register_buffer("table", table)  # (M, d)
        self.query_token = table.shape[0]

    def core_inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        """Ids (B, T) → the model's core inputs (B, T, in) for the vectors they name."""
        M, d = self.table.shape
        is_query = tokens == M
        x = self.table[torch.where(is_query, 0, tokens)] * (~is_query)[..., None]  # (B, T, d)
        return self.model.core_inputs(torch.cat([x, is_query[..., None].to(x.dtype)], dim=-1))  # (B, T, in)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Ids (B, T) → the model's point predictions (B, T, d)."""
        return self.model.to_logits(self.model.core(self.core_inputs(tokens)))


def probe_table(dim: int, seed: int, size: int = TABLE_SIZE) -> torch.Tensor:
    """The probe vectors (size, dim): points uniform on S^(dim−1) from a generator seeded ``seed``."""
    return sphere_points((size,), dim, torch.Generator().manual_seed(seed))


def vector_probe_model(model: nn.Module, seed: int) -> VectorProbeModel:
    """``model`` (vector inputs of width d = its vocab_size) with the probe table of ``seed``."""
    table = probe_table(model.config.vocab_size, seed).to(next(model.parameters()).device)
    return VectorProbeModel(model, table)
