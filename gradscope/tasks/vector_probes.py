"""Gradient-stability probes for vector-token models (the continuous task, paper App. B.3).

The probe machinery (SPEC §4) builds triplets of token ids. For a model that reads vectors, the
ids index a fixed table of M points drawn uniformly on the sphere S^(d−1) (seeded), and id M is the
query: :class:`VectorProbeModel` maps ids to the model's vector inputs and leaves everything else
(core, PE, readout) to the model. With the table, the probe definitions carry over unchanged:

- the *target* is the vector read at position p; the *disturbants* are the vectors at every other
  input position (prefix and suffix);
- base = (P, x, S), same-target = (P, x, S′) (new suffix vectors), same-suffix = (P′, x′, S) (a
  new target vector and prefix);
- there is one frequency class: every point of the sphere is as likely, so the only condition is
  all/all (target group ``all``, disturbant group ``all``).

With M = 4096 points a probe draws L vectors out of 4096, so a repeat within a triplet is rare
but possible, as repeats are (with probability 0) not in the task; the table is a function of
the seed, so the probes are reproducible.
"""

from __future__ import annotations

import torch
from torch import nn

from gradscope.tasks.reverse_continuous import sphere_points

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
