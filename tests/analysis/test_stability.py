"""The stability plan: exact Jacobians where they fit the time and memory budgets, else a sketch, and the
triplets per chunk shrunk to the memory budget."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradscope.analysis.stability import plan_stability
from gradscope.errors import GradscopeError


def test_chunk_shrinks_to_the_memory_budget() -> None:
    from gradscope.analysis.stability import triplets_per_chunk
    from gradscope.config import ModelConfig
    from gradscope.models import SeqModel
    s4d = SeqModel(ModelConfig(core="s4d", vocab_size=4, embed_size=4, hidden_size=8, core_config={"state_size": 16}))
    per_triplet = 3 * 8 * (8 * 16) * 4  # 3 Jacobians of D_out × D float32 values
    assert triplets_per_chunk(s4d, 32, 10 * per_triplet) == 10
    assert triplets_per_chunk(s4d, 32, 1) == 1
    assert triplets_per_chunk(s4d, 4, 1 << 30) == 4


class _Wide(nn.Module):
    """Only what the plan reads: state and output widths and the weights of a step."""

    def __init__(self, state_dim: int, out_dim: int, weights: int, complex_state: bool = False) -> None:
        super().__init__()
        self.state_dim, self.out_dim, self.complex_state = state_dim, out_dim, complex_state
        self.w = nn.Parameter(torch.zeros(weights))
        self.embed = nn.Embedding(50_000, 768)  # an embedding is a lookup, not a multiply per weight


def test_plan_exact_where_it_fits_else_a_sketch() -> None:
    tiny = plan_stability(_Wide(64, 32, 10_000), 96, 12, 1)
    assert tiny.estimator == "exact" and "fits the 600 s budget" in tiny.note
    big = _Wide(700_416, 768, 90_000_000)  # mamba-130m's widths and weights
    plan = plan_stability(big, 768, 32, 1, checkpoint_budget_seconds=3600)  # ~17 min even sketched (bench/realsize.py)
    assert plan.estimator == "sketch" and 4 <= plan.units <= 16 and plan.columns == plan.units
    assert "exact J = ∂y_T/∂z_p (768 × 700416) would take" in plan.note
    assert plan_stability(big, 768, 32, 1, estimator="exact").estimator == "exact"  # asked for: obeyed
    assert plan_stability(_Wide(64, 32, 10_000), 96, 12, 1, estimator="sketch", units=5).columns == 5
    assert plan_stability(_Wide(64, 32, 10_000, True), 96, 12, 1, estimator="sketch", units=5).columns == 10
    assert plan_stability(big, 768, 32, 1, checkpoint_budget_seconds=1e9, memory_bytes=1 << 40).estimator == "exact"
    assert plan_stability(big, 768, 32, 1, checkpoint_budget_seconds=1e9, memory_bytes=1 << 30).estimator == "sketch"  # J too big
    with pytest.raises(GradscopeError, match=r"checkpoint_budget_seconds: exact J .* a sketch of 4 units ~[\d,]+ s \(budget 10 s\)"):
        plan_stability(big, 768, 32, 1, checkpoint_budget_seconds=10)
    with pytest.raises(GradscopeError, match="estimator: got 'fast'"):
        plan_stability(big, 768, 32, 1, estimator="fast")
