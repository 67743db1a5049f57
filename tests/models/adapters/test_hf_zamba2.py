"""gradscope.wrap(transformers Zamba2ForCausalLM / Zamba2Model): Mamba-2 layers, and at the hybrid layers a shared
transformer block (attention on [stream, embedding] with per-invocation LoRA adapters and rotary, then an MLP and
a linear layer feeding the Mamba-2 mixer's input) whose keys and values, one cache per hybrid layer, are part of
the state; against a float64 brute force through transformers' own forward and cache (tests/helpers/adapterkit.py):
J = ∂y_T/∂z_p, the state's size, S(A, A) = 1, the declared blocks against torch.func's J_t, and the Mamba-2
heads' exponents with the caches held (issue #49)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from gradscope.errors import GradscopeError  # noqa: E402
from tests.helpers.adapterkit import (Family, check_held_spectrum, check_hybrid,  # noqa: E402
                                      check_state_jacobian, conv_state_parts, set_conv_state_parts)

B, T, V, POSITIONS = 2, 6, 30, 7
RTOL = 2e-6  # transformers runs its SSD scan, norms and softmax in float32 even for a float64 model
HIDDEN, HEADS, HEAD_DIM, GROUPS, STATE, KERNEL = 8, 4, 4, 2, 4, 3
ATT_HEADS = 2
ATT_DIM = 2 * HIDDEN // ATT_HEADS  # Zamba2's attention reads [stream, embedding]: head dim 2·hidden / heads
TYPES = ["linear_attention", "hybrid", "linear_attention", "hybrid"]
CONV = 2 * HIDDEN + 2 * GROUPS * STATE
MAMBA = CONV * (KERNEL - 1) + HEADS * HEAD_DIM * STATE  # one Mamba-2 layer's state


def tiny(bare: bool = False, mem_blocks: int = 1, kv_heads: int = ATT_HEADS, lora: bool = True,
         rope: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.Zamba2Config(vocab_size=V, hidden_size=HIDDEN, num_hidden_layers=len(TYPES),
                                    layers_block_type=TYPES, mamba_d_state=STATE, mamba_d_conv=KERNEL, mamba_expand=2,
                                    mamba_ngroups=GROUPS, n_mamba_heads=HEADS, num_attention_heads=ATT_HEADS,
                                    num_key_value_heads=kv_heads, intermediate_size=12, num_mem_blocks=mem_blocks,
                                    use_shared_attention_adapter=lora, adapter_rank=3, use_mem_rope=rope,
                                    chunk_size=4, attn_implementation="eager")
    model = (transformers.Zamba2Model if bare else transformers.Zamba2ForCausalLM)(cfg).eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(10)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".D"):
                p.uniform_(0.5, 1.5, generator=gen)
            elif "dt_bias" in name or "conv1d.bias" in name:
                p.normal_(0.0, 0.5, generator=gen)
            elif "adapter_list" in name:  # the library's LoRA adapters start at 0.02-scale noise: make them count
                p.normal_(0.0, 0.4, generator=gen)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0, generator=gen)
    return model.double()


def family(model: torch.nn.Module) -> Family:
    """The library's own ``DynamicCache`` in the documented layout: a hybrid layer's cache layer holds its keys and
    values (zero-padded to POSITIONS slots) and then its Mamba-2 conv window and state; a Mamba-2 layer's its conv
    window and state. ``step`` sets the cache to the parts and runs the library's one-token path token by token, with
    explicit positions. J by forward mode, as for Mamba-2 (its one-token path writes the state in place)."""
    bb = getattr(model, "model", model)

    def read(cache) -> list[torch.Tensor]:  # noqa: ANN001
        out: list[torch.Tensor] = []
        for l, kind in enumerate(TYPES):
            layer = cache.layers[l]
            if kind == "hybrid":
                for kv in (layer.keys, layer.values):  # (B, H_kv, n, d) → (B, positions, H_kv, d)
                    pad = kv.new_zeros(kv.shape[0], kv.shape[1], POSITIONS - kv.shape[2], kv.shape[3])
                    out.append(torch.cat([kv, pad], dim=2).transpose(1, 2))
            out += conv_state_parts(layer)
        return out

    def state(tokens: torch.Tensor) -> list[torch.Tensor]:
        return [q.clone() for q in read(bb(input_ids=tokens, use_cache=True).cache)]

    def step(parts: list[torch.Tensor], columns: torch.Tensor, t0: int):  # noqa: ANN202
        with torch.no_grad():
            cache = bb(input_ids=columns[:, :1], use_cache=True).cache  # a cache of the right batch, overwritten
        it = iter(parts)
        for l, kind in enumerate(TYPES):
            layer = cache.layers[l]
            if kind == "hybrid":
                layer.keys, layer.values = (next(it)[:, :t0].transpose(1, 2).contiguous() for _ in range(2))
            set_conv_state_parts(layer, it)
        for t in range(columns.shape[1]):
            position = torch.full((columns.shape[0], 1), t0 + t, dtype=torch.long)
            y = bb(input_ids=columns[:, t:t + 1], cache=cache, use_cache=True,
                   position_ids=position).last_hidden_state[:, -1]
        return y, read(cache)

    return Family(model, state, step, V, reverse=False)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def test_state_jacobian_and_scores_match_the_library_cache() -> None:
    model = tiny()
    wrapped = gradscope.wrap(model, positions=POSITIONS)
    core = wrapped.core
    assert list(core.state_layout()) == ["l0/conv", "l0/ssm", "l1/keys", "l1/values", "l1/conv", "l1/ssm",
                                         "l2/conv", "l2/ssm", "l3/keys", "l3/values", "l3/conv", "l3/ssm"]
    assert core.state_dim == 4 * MAMBA + 2 * 2 * POSITIONS * ATT_HEADS * ATT_DIM
    check_hybrid(family(model), wrapped, tokens, RTOL)


def test_grouped_keys_without_adapters_or_rotary() -> None:
    """A shared block without attention adapters and without rotary embedding, its keys and values with 1 head
    for 2 query heads."""
    model = tiny(kv_heads=1, lora=False, rope=False)
    wrapped = gradscope.wrap(model, positions=POSITIONS)
    assert wrapped.core.state_dim == 4 * MAMBA + 2 * 2 * POSITIONS * 1 * ATT_DIM
    check_state_jacobian(family(model), wrapped, tokens(3), 3, "func", RTOL)


def test_the_bare_model_with_two_shared_blocks() -> None:
    """num_mem_blocks = 2: each hybrid layer runs its own block, with its invocation's adapters."""
    bare = tiny(bare=True, mem_blocks=2)
    wrapped = gradscope.wrap(bare, positions=POSITIONS)
    assert wrapped.readout is None
    check_state_jacobian(family(bare), wrapped, tokens(4), 2, "vjp", RTOL)


def test_declared_blocks_and_the_heads_exponents_with_the_caches_held() -> None:
    """Every declared block equals J_t's own (torch.func) and J_t is lower-triangular over them (a hybrid layer's
    keys and values come before its Mamba-2 state, which reads them); the spectrum, the caches held, has the
    Mamba-2 states only: P·N finite exponents a head and the conv windows' −∞."""
    wrapped = gradscope.wrap(tiny(), positions=POSITIONS)
    check_held_spectrum(wrapped.core, wrapped.core_inputs(tokens(12, length=POSITIONS)),
                        finite=4 * HEADS * HEAD_DIM * STATE, minus_inf=4 * CONV * (KERNEL - 1))


def test_a_length_beyond_the_cache_is_refused() -> None:
    wrapped = gradscope.wrap(tiny(), positions=4)
    with pytest.raises(GradscopeError, match="positions=N"):
        gradscope.state_jacobian(wrapped, tokens(1, length=5), 2)


def test_a_rotary_embedding_that_rescales_with_the_length_is_refused() -> None:
    cfg = transformers.Zamba2Config(vocab_size=V, hidden_size=HIDDEN, num_hidden_layers=2,
                                    layers_block_type=["hybrid", "linear_attention"], mamba_d_state=STATE,
                                    mamba_d_conv=KERNEL, n_mamba_heads=HEADS, mamba_ngroups=GROUPS,
                                    num_attention_heads=ATT_HEADS, intermediate_size=12, use_mem_rope=True,
                                    rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
                                    attn_implementation="eager")
    with pytest.raises(GradscopeError, match="rope_type='dynamic'"):
        gradscope.wrap(transformers.Zamba2Model(cfg).eval().double(), positions=4)
