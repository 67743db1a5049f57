"""Positional encodings: the sinusoidal formula, and each kind and combination with the embedding (SPEC §2)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.models.test_seq import _model


def test_sinusoidal_pe_matches_formula_and_has_unit_norm() -> None:
    model = _model("gru", pe="sinusoidal")
    table = model.time_encoder(20).double()  # (T, E)
    E = 6
    for t in range(20):
        for i in range(E // 2):
            w = 10000 ** (-2 * i / E)
            assert table[t, i].item() == pytest.approx(math.sin(w * t) / math.sqrt(E / 2), abs=1e-6)
            assert table[t, E // 2 + i].item() == pytest.approx(math.cos(w * t) / math.sqrt(E / 2), abs=1e-6)
    assert torch.allclose(table.norm(dim=-1), torch.ones(20, dtype=torch.float64), atol=1e-6)


def test_pe_kinds_and_combination() -> None:
    tokens = torch.randint(0, 9, (2, 7), generator=torch.Generator().manual_seed(5))
    concat = _model("gru", pe="sinusoidal")
    assert concat.core_inputs(tokens).shape == (2, 7, 12)
    added = _model("gru", pe="sinusoidal", combine="add")
    x = added.core_inputs(tokens)
    assert torch.allclose(x, added.embedding(tokens) + added.time_encoder(7))
    random_pe = _model("gru", pe="random")
    assert torch.allclose(random_pe.time_encoder.embeddings.norm(dim=-1), torch.ones(40))
    assert "time_encoder.embeddings" in dict(random_pe.named_buffers())
    learnable = _model("gru", pe="learnable")
    assert "time_encoder.embeddings" in dict(learnable.named_parameters())
    dummy = _model("gru", pe="dummy")
    d = dummy.core_inputs(tokens)
    # bit for bit: the dummy PE is a copy of the embedding
    assert torch.equal(d[..., :6], d[..., 6:])
    vanilla = _model("gru")
    # a dummy model has the parameter count of a PE model with the same concat width
    assert sum(p.numel() for p in dummy.parameters()) == sum(p.numel() for p in concat.parameters())
    assert sum(p.numel() for p in vanilla.parameters()) < sum(p.numel() for p in dummy.parameters())
