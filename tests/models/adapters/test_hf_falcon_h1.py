"""gradscope.wrap(transformers FalconH1ForCausalLM / FalconH1Model): in every layer a Mamba-2 mixer and an attention
layer in parallel (its keys and values part of the state), every μP multiplier set to its own value other than 1,
against a float64 brute force through transformers' own forward and cache (tests/helpers/adapterkit.py): J =
∂y_T/∂z_p, the state's size and layout, S(A, A) = 1, the declared blocks against torch.func's J_t, and the Mamba-2
heads' exponents with the caches held; with and without the mixer's gated norm, the gate before or after it."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from gradscope.errors import GradscopeError  # noqa: E402
from tests.helpers.adapterkit import (Family, check_held_spectrum, check_hybrid, check_state_jacobian,  # noqa: E402
                                      conv_state_parts, set_conv_state_parts)

B, T, V, POSITIONS, LAYERS = 2, 6, 30, 8, 2
RTOL = 2e-6  # transformers runs its SSD scan, norms and softmax in float32 even for a float64 model
HIDDEN, HEADS, HEAD_DIM, GROUPS, STATE, KERNEL, D_SSM = 16, 4, 8, 2, 4, 3, 32
ATT_HEADS, KV_HEADS = 4, 2
# every multiplier its own value, none 1: an adapter that left one out (or swapped two) gives other numbers
MULTIPLIERS = dict(embedding_multiplier=1.7, lm_head_multiplier=0.6, mlp_multipliers=[1.4, 0.7], key_multiplier=1.3,
                   attention_in_multiplier=1.2, attention_out_multiplier=0.8, ssm_in_multiplier=1.1,
                   ssm_out_multiplier=0.75, ssm_multipliers=[0.9, 1.3, 0.7, 1.6, 1.2])


def tiny(bare: bool = False, **extra) -> torch.nn.Module:  # noqa: ANN003
    torch.manual_seed(0)
    cfg = transformers.FalconH1Config(vocab_size=V, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                      num_attention_heads=ATT_HEADS, num_key_value_heads=KV_HEADS, intermediate_size=24,
                                      mamba_d_ssm=D_SSM, mamba_n_heads=HEADS, mamba_d_head=HEAD_DIM,
                                      mamba_d_state=STATE, mamba_d_conv=KERNEL, mamba_n_groups=GROUPS,
                                      mamba_chunk_size=4, attn_implementation="eager", **{**MULTIPLIERS, **extra})
    model = (transformers.FalconH1Model if bare else transformers.FalconH1ForCausalLM)(cfg).eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(10)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".D"):
                p.uniform_(0.5, 1.5, generator=gen)
            elif "dt_bias" in name or "conv1d.bias" in name:
                p.normal_(0.0, 0.5, generator=gen)
    return model.double()


def family(model: torch.nn.Module) -> Family:
    """The library's cache in the documented layout, by brute force: every layer of its ``DynamicCache`` is a
    ``LinearAttentionAndFullAttentionLayer`` holding both halves, read as (conv window without its unread oldest
    input, ssm state, keys, values), the keys and values (positions, H_kv, d) zero-padded beyond the tokens read.
    ``step`` runs the library's one-token path token by token from a cache set to the parts (its forward counts
    the positions from the cache's keys). J by forward mode, as for Mamba-2 (its one-token path writes the state
    in place)."""
    bb = getattr(model, "model", model)

    def read(cache) -> list[torch.Tensor]:  # noqa: ANN001
        out: list[torch.Tensor] = []
        for layer in cache.layers:
            out += conv_state_parts(layer)
            for kv in (layer.keys, layer.values):  # (B, H_kv, n, d) → (B, positions, H_kv, d)
                pad = kv.new_zeros(kv.shape[0], kv.shape[1], POSITIONS - kv.shape[2], kv.shape[3])
                out.append(torch.cat([kv, pad], dim=2).transpose(1, 2))
        return out

    def state(tokens: torch.Tensor) -> list[torch.Tensor]:
        return [q.clone() for q in read(bb(input_ids=tokens, use_cache=True).cache)]

    def step(parts: list[torch.Tensor], columns: torch.Tensor, t0: int):  # noqa: ANN202
        with torch.no_grad():
            cache = bb(input_ids=columns[:, :1], use_cache=True).cache  # a cache of the right batch, overwritten
        assert {type(layer).__name__ for layer in cache.layers} == {"LinearAttentionAndFullAttentionLayer"}
        it = iter(parts)
        for layer in cache.layers:
            set_conv_state_parts(layer, it)
            layer.keys, layer.values = (next(it)[:, :t0].transpose(1, 2).contiguous() for _ in range(2))
        for t in range(columns.shape[1]):  # the one-token path, token by token
            y = bb(input_ids=columns[:, t:t + 1], cache=cache, use_cache=True).last_hidden_state[:, -1]
        return y, read(cache)

    return Family(model, state, step, V, reverse=False)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


CONV = D_SSM + 2 * GROUPS * STATE  # the conv's channels: x, B, C


def test_state_jacobian_and_scores_match_the_library_cache() -> None:
    model = tiny()
    wrapped = gradscope.wrap(model, positions=POSITIONS)
    core = wrapped.core
    assert list(core.state_layout()) == [f"l{i}/{part}" for i in range(LAYERS) for part in ("conv", "ssm", "keys",
                                                                                              "values")]
    d = HIDDEN // ATT_HEADS
    assert core.state_dim == LAYERS * (CONV * (KERNEL - 1) + HEADS * HEAD_DIM * STATE + 2 * POSITIONS * KV_HEADS * d)
    check_hybrid(family(model), wrapped, tokens, RTOL)


@pytest.mark.parametrize("before", [True, False])
def test_the_bare_model_with_the_mixers_gated_norm(before: bool) -> None:
    bare = tiny(bare=True, mamba_rms_norm=True, mamba_norm_before_gate=before)
    wrapped = gradscope.wrap(bare, positions=POSITIONS)
    assert wrapped.readout is None
    check_state_jacobian(family(bare), wrapped, tokens(4), 2, "vjp", RTOL)


def test_declared_blocks_and_the_heads_exponents_with_the_cache_held() -> None:
    """Every declared block equals J_t's own (torch.func) and J_t is lower-triangular over them (the attention
    half reads no part of its own layer's Mamba state); the spectrum, the caches held, has the recurrent blocks'
    entries only: P·N finite exponents a head and the conv windows' −∞."""
    wrapped = gradscope.wrap(tiny(), positions=POSITIONS)
    check_held_spectrum(wrapped.core, wrapped.core_inputs(tokens(12, length=POSITIONS)),
                        finite=LAYERS * HEADS * HEAD_DIM * STATE, minus_inf=LAYERS * CONV * (KERNEL - 1))


def test_a_longer_sequence_and_another_activation_are_refused_in_one_line() -> None:
    wrapped = gradscope.wrap(tiny(), positions=4)
    with pytest.raises(GradscopeError, match="positions=N") as err:
        gradscope.state_jacobian(wrapped, tokens(3, length=6), 2)
    assert "\n" not in str(err.value)
    with pytest.raises(GradscopeError, match="hidden_act") as err:
        gradscope.wrap(tiny(hidden_act="gelu"))
    assert "\n" not in str(err.value)
