"""gradscope.wrap(transformers RecurrentGemmaForCausalLM, recurrent blocks) against a float64 brute force
through transformers' own forward and the states it keeps on its modules (tests/helpers/adapterkit.py); attention
blocks are refused in one line."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from tests.helpers.adapterkit import (Family, check_gradient_flow, check_lyapunov_sum, check_stability,  # noqa: E402
                        check_state_jacobian)

from gradscope.errors import GradscopeError  # noqa: E402

B, T, V = 3, 6, 20
RTOL = 2e-6  # transformers accumulates the RG-LRU and its norms in float32 even in float64


def tiny(**extra) -> torch.nn.Module:  # noqa: ANN003
    torch.manual_seed(0)
    cfg = transformers.RecurrentGemmaConfig(**{**dict(vocab_size=V, hidden_size=8, intermediate_size=16,
                                                       num_attention_heads=2, num_hidden_layers=2,
                                                       block_types=["recurrent"], conv1d_width=3,
                                                       attention_window_size=16), **extra})
    model = transformers.RecurrentGemmaForCausalLM(cfg).eval().double()
    with torch.no_grad():  # default init gives zero biases and tiny gates: make every term count
        for layer in model.model.layers:
            if not hasattr(layer.temporal_block, "conv_1d"):
                continue  # an attention block
            layer.temporal_block.conv_1d.bias.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(2))
            layer.temporal_block.linear_x.weight.mul_(3.0)
    return model


def family(model: torch.nn.Module) -> Family:
    """RecurrentGemma's per-layer states (conv1d_state (B, W, K−1), rg_lru.recurrent_states (B, W)), which the
    library keeps on its modules, in the documented layout."""
    rg = model.model
    blocks = [layer.temporal_block for layer in rg.layers]

    def read() -> list[torch.Tensor]:
        return [q for tb in blocks for q in (tb.conv1d_state, tb.rg_lru.recurrent_states)]

    def state(tokens: torch.Tensor) -> list[torch.Tensor]:
        pos = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)  # (transformers cannot find positions in a
        rg(input_ids=tokens, position_ids=pos, use_cache=True,  # cache of recurrent layers alone: give them)
           attention_mask={"sliding_attention": None})  # the prefill writes the states onto the modules
        return [q.clone() for q in read()]

    def step(parts: list[torch.Tensor], columns: torch.Tensor, t0: int):  # noqa: ANN202
        for i, tb in enumerate(blocks):
            tb.conv1d_state, tb.rg_lru.recurrent_states = parts[2 * i], parts[2 * i + 1]
        for j in range(columns.shape[1]):  # the decoding path, one token at a time at its position
            pos = torch.full((columns.shape[0], 1), t0 + j)
            # a cache object keeps the model from resetting its states; the mask (of attention blocks only)
            # is given, since transformers cannot build one from a cache of recurrent layers alone
            out = rg(input_ids=columns[:, j:j + 1], position_ids=pos, use_cache=True,
                     cache=transformers.DynamicCache(config=rg.config), attention_mask={"sliding_attention": None})
        return out.last_hidden_state[:, -1], read()

    return Family(model, state, step, V, forward_steps=False)


@pytest.fixture(scope="module")
def gemma():  # noqa: ANN201
    model = tiny()
    return model, gradscope.wrap(model), family(model)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def test_wrap_runs_on_the_model_itself(gemma) -> None:  # noqa: ANN001
    model, wrapped, _ = gemma
    assert wrapped.core.model is model.model and wrapped.readout.lm_head is model.lm_head
    assert wrapped.core.position_dependent
    ours = {p.data_ptr() for p in wrapped.parameters()}
    assert all(p.data_ptr() in ours for p in model.parameters())
    assert list(wrapped.core.state_layout()) == ["l0/conv", "l0/rglru", "l1/conv", "l1/rglru"]
    with torch.no_grad():
        assert float((wrapped(tokens(9)) - model(input_ids=tokens(9), use_cache=False).logits).abs().max()) < 1e-5


@pytest.mark.parametrize("p,method", [(1, "vjp"), (3, "func"), (T - 1, "auto")])
def test_state_jacobian_matches_the_library(gemma, p: int, method: str) -> None:  # noqa: ANN001
    model, wrapped, fam = gemma
    check_state_jacobian(fam, wrapped, tokens(1), p, method, RTOL)


def test_stability_gradient_flow_and_lyapunov_sum(gemma) -> None:  # noqa: ANN001
    model, wrapped, fam = gemma
    check_stability(fam, wrapped, L=5, p=2, rtol=1e-6)
    check_gradient_flow(fam, wrapped, tokens(2, n=2), rtol=RTOL)
    check_lyapunov_sum(fam, wrapped, tokens(3, n=2, length=9), warmup=2, atol=1e-6)


def test_attention_blocks_are_refused_in_one_line() -> None:
    with pytest.raises(GradscopeError, match="local-attention block") as err:
        gradscope.wrap(tiny(block_types=["recurrent", "attention"]))
    assert "\n" not in str(err.value)
