"""Models: fused vs functional cells, S4D FFT vs recurrence, positional encodings (SPEC §2)."""

from __future__ import annotations

import math

import pytest
import torch

from gradscope.models import SeqModel
from gradscope.models.s4d import S4DCore

from tests.helpers.cores import tiny_config


def _model(core: str, pe: str = "none", layers: int = 1, combine: str = "concat", seed: int = 0) -> SeqModel:
    torch.manual_seed(seed)
    return SeqModel(tiny_config(core, 9, 6, 10, layers, pe, max_len=40, combine=combine))


@pytest.mark.parametrize("core", ["elman", "gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 3])
def test_fused_and_functional_cells_agree(core: str, layers: int) -> None:
    """float32, as trained: the fused nn.RNN/GRU/LSTM and the functional step agree to 1e-5."""
    model = _model(core, pe="sinusoidal", layers=layers)
    tokens = torch.randint(0, 10, (5, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x = model.core_inputs(tokens)
        fused = model.core(x)
        functional, states = model.core.scan(x)
    assert states.shape == (5, 30, model.core.state_dim)
    assert torch.allclose(fused, functional, atol=1e-5, rtol=0)
    # the state layout: the top layer's h is the output (LSTM: first half of the top layer's [h, c])
    top = states[..., -model.core.layer_state:]
    assert torch.allclose(top[..., :10], functional, atol=0, rtol=0)


@pytest.mark.parametrize("core", ["elman", "gru", "lstm"])
def test_functional_cell_matches_fused_hidden_state(core: str) -> None:
    """The full state z (incl. the LSTM cell c) equals what the fused module returns at the end."""
    model = _model(core, layers=2).double()
    tokens = torch.randint(0, 10, (3, 12), generator=torch.Generator().manual_seed(2))
    x = model.core_inputs(tokens)
    _, final = model.core.rnn(x)
    _, states = model.core.scan(x)
    z = states[:, -1]
    if core == "lstm":
        h, c = final
        expected = torch.cat([torch.cat([h[l], c[l]], dim=-1) for l in range(2)], dim=-1)
    else:
        expected = torch.cat([final[l] for l in range(2)], dim=-1)
    assert torch.allclose(z, expected, atol=1e-12)


@pytest.mark.parametrize("blocks", [1, 2])
def test_s4d_fft_convolution_matches_recurrence(blocks: int) -> None:
    torch.manual_seed(3)
    core = S4DCore(input_size=5, channels=6, num_layers=blocks, state_size=8, dt_min=1e-3, dt_max=1e-1)
    with torch.no_grad():  # make the dynamics non-trivial: slower decay, larger steps
        for block in core.ssm:
            block.kernel.log_dt.fill_(math.log(0.3))
    x = torch.randn(4, 50, 5)
    with torch.no_grad():
        fft = core(x)
        rec, _ = core.scan(x)
    assert torch.allclose(fft, rec, atol=1e-5, rtol=0)


def test_s4d_kernel_matches_definition() -> None:
    """K_l = 2·Re(Σ_n C_n dB_n dA_n^l), evaluated independently in complex128."""
    torch.manual_seed(4)
    core = S4DCore(3, 4, 1, 6, 1e-3, 1e-1).double()
    kernel = core.ssm[0].kernel
    dt = torch.exp(kernel.log_dt)
    A = -torch.exp(kernel.log_A_real) + 1j * kernel.A_imag
    C = torch.view_as_complex(kernel.C.contiguous())
    dA = torch.exp(dt[:, None] * A)
    dB = (dA - 1) / A
    expected = torch.stack([2 * (C * dB * dA ** l).sum(-1).real for l in range(7)], dim=-1)
    assert torch.allclose(kernel(7), expected, atol=1e-12)
    # initialisation of SPEC §2: A_n = −0.5 + iπn, log_dt in [log 1e-3, log 1e-1]
    assert torch.allclose(A, (-0.5 + 1j * math.pi * torch.arange(3)).expand(4, 3).to(A.dtype))
    assert bool(((dt >= 1e-3 - 1e-12) & (dt <= 1e-1 + 1e-12)).all())


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


def test_query_token_row_exists() -> None:
    model = _model("lstm")
    assert model.embedding.num_embeddings == 10 and model.query_token == 9
    assert model(torch.full((1, 3), 9)).shape == (1, 3, 9)
