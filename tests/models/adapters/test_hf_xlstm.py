"""gradscope.wrap(transformers xLSTMForCausalLM) against a float64 brute force through transformers' own
xLSTM blocks and their (C, n, m) states (tests/helpers/adapterkit.py). The brute force calls the model's blocks
with their states as xLSTMModel.forward does: transformers' own xLSTMCache takes its shapes from the
config's qk_head_dim, which disagrees with the layers of a small model."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from tests.helpers.adapterkit import (Family, check_gradient_flow, check_lyapunov_sum, check_stability,  # noqa: E402
                        check_state_jacobian)

B, T, V = 3, 6, 20
RTOL = 2e-5  # transformers keeps the mLSTM state in float32 (inference_state_dtype) even in float64


def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.xLSTMConfig(vocab_size=V, hidden_size=8, num_heads=2, num_hidden_layers=2,
                                   inference_state_dtype="float32", autocast_kernel_dtype="float32")
    model = transformers.xLSTMForCausalLM(cfg).eval().double()
    with torch.no_grad():  # forget-gate biases around 0 so that both branches of the stabiliser's maximum occur
        for block in model.backbone.blocks:
            block.mlstm_layer.fgate_preact.bias.uniform_(-2.0, 2.0, generator=torch.Generator().manual_seed(2))
    return model


def family(model: torch.nn.Module) -> Family:
    """The blocks' states in the documented layout: per block m (heads), C (heads, dqk, dv), n (heads, dqk)."""
    bb = model.backbone

    def run(tokens: torch.Tensor, states):  # noqa: ANN001, ANN202
        h = bb.embeddings(tokens)
        new = []
        for l, block in enumerate(bb.blocks):
            h, st = block(h, None if states is None else states[l])
            new.append(st)
        return bb.out_norm(h)[:, -1], [q for (C, n, m) in new for q in (m[..., 0], C, n)]

    def state(tokens: torch.Tensor) -> list[torch.Tensor]:
        return [q.clone() for q in run(tokens, None)[1]]

    def step(parts: list[torch.Tensor], columns: torch.Tensor, t0: int):  # noqa: ANN202
        states = [(parts[3 * l + 1], parts[3 * l + 2], parts[3 * l][..., None]) for l in range(len(bb.blocks))]
        return run(columns, states)

    return Family(model, state, step, V)


@pytest.fixture(scope="module")
def xlstm():  # noqa: ANN201
    model = tiny()
    return model, gradscope.wrap(model), family(model)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def test_wrap_runs_on_the_model_itself(xlstm) -> None:  # noqa: ANN001
    model, wrapped, _ = xlstm
    assert wrapped.core.model is model.backbone and wrapped.readout.lm_head is model.lm_head
    ours = {p.data_ptr() for p in wrapped.parameters()}
    assert all(p.data_ptr() in ours for p in model.parameters())
    assert list(wrapped.core.state_layout())[:3] == ["l0/m", "l0/C", "l0/n"]
    assert wrapped.core.state_dim == 2 * (2 + 2 * 2 * 4 + 2 * 2)  # the layers' dqk = 2, not the config's 32
    with torch.no_grad():
        assert float((wrapped(tokens(9)) - model(input_ids=tokens(9), use_cache=False).logits).abs().max()) < 1e-4


@pytest.mark.parametrize("p,method", [(1, "vjp"), (3, "func"), (T - 1, "auto")])
def test_state_jacobian_matches_the_library(xlstm, p: int, method: str) -> None:  # noqa: ANN001
    model, wrapped, fam = xlstm
    check_state_jacobian(fam, wrapped, tokens(1), p, method, RTOL)


def test_stability_gradient_flow_and_lyapunov_sum(xlstm) -> None:  # noqa: ANN001
    model, wrapped, fam = xlstm
    check_stability(fam, wrapped, L=5, p=2, rtol=1e-5)
    check_gradient_flow(fam, wrapped, tokens(2, n=2), rtol=RTOL)
    check_lyapunov_sum(fam, wrapped, tokens(3, n=2, length=10), warmup=2, atol=1e-5)
