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

from typing import TYPE_CHECKING, ClassVar

import torch

from gradscope.errors import check
from gradscope.tasks.base import Batch, Task

if TYPE_CHECKING:
    from gradscope.tasks.config import TaskConfig


def sphere_points(shape: tuple[int, ...], dim: int, gen: torch.Generator) -> torch.Tensor:
    """Points uniform on S^(dim−1): normalised standard normal draws, (*shape, dim) float32."""
    x = torch.randn((*shape, dim), generator=gen, device=gen.device)
    return x / x.norm(dim=-1, keepdim=True)


class ReverseContinuous(Task):
    name: ClassVar[str] = "reverse-continuous"
    settings: ClassVar[tuple[str, ...]] = ("dim",)  # points of a sphere: one frequency class
    probes: ClassVar[bool] = True
    inputs: ClassVar[str] = "vectors"
    evaluation: ClassVar[str] = "vectors"  # cosine similarity of point predictions
    tiny = {"dim": 3}

    @classmethod
    def check_config(cls, cfg: "TaskConfig") -> None:
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
