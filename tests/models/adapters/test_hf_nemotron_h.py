"""gradscope.wrap(transformers NemotronHForCausalLM / NemotronHModel): Mamba-2 blocks, an attention block (no
positional embedding) whose keys and values are part of the state, a relu² MLP block and a mixture-of-experts
block, against a float64 brute force through transformers' own forward and cache
(tests/helpers/adapterkit.py): J = ∂y_T/∂z_p, the state's size, S(A, A) = 1, the declared blocks against
torch.func's J_t, and the Mamba-2 heads' exponents with the cache held (issue #49)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from tests.helpers.adapterkit import (Family, check_held_spectrum, check_hybrid, check_stability,  # noqa: E402
                                      check_state_jacobian, hybrid_family)

B, T, V, POSITIONS = 2, 6, 30, 10
RTOL = 2e-6  # transformers runs its SSD scan, norms and softmax in float32 even for a float64 model
HIDDEN, HEADS, HEAD_DIM, GROUPS, STATE, KERNEL = 16, 4, 8, 2, 4, 3
TYPES = ["linear_attention", "full_attention", "mlp", "linear_attention"]


MOE_TYPES = ["linear_attention", "full_attention", "moe", "linear_attention"]
# 8 experts in 2 groups, 3 chosen from the best group, through a latent projection, scaled: every routing rule counts
MOE = dict(n_routed_experts=8, num_experts_per_tok=3, n_group=2, topk_group=1, routed_scaling_factor=1.7,
           moe_intermediate_size=8, moe_shared_expert_intermediate_size=12, moe_latent_size=12,
           experts_implementation="eager")  # the default grouped_mm kernel takes no float64


def tiny(bare: bool = False, pattern: str = "M*-M", **extra) -> torch.nn.Module:  # noqa: ANN003
    torch.manual_seed(0)
    cfg = transformers.NemotronHConfig(vocab_size=V, hidden_size=HIDDEN, num_hidden_layers=4,
                                       hybrid_override_pattern=pattern, mamba_num_heads=HEADS, mamba_head_dim=HEAD_DIM,
                                       n_groups=GROUPS, ssm_state_size=STATE, conv_kernel=KERNEL, expand=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=4, intermediate_size=24,
                                       chunk_size=4, use_conv_bias=True, attn_implementation="eager", **extra)
    model = (transformers.NemotronHModel if bare else transformers.NemotronHForCausalLM)(cfg).eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(10)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".D"):
                p.uniform_(0.5, 1.5, generator=gen)
            elif "dt_bias" in name or "conv1d.bias" in name:
                p.normal_(0.0, 0.5, generator=gen)
            elif "experts" in name or "gate.weight" in name or "latent_proj" in name:
                p.normal_(0.0, 0.4, generator=gen)
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.normal_(0.0, 0.3, generator=gen)
    return model.double()


def family(model: torch.nn.Module, types: list[str] = TYPES) -> Family:
    """The library's cache in the documented layout (tests/helpers/adapterkit.hybrid_family); J by forward mode,
    as for Mamba-2 (its one-token path writes the state in place)."""
    return hybrid_family(model, types, POSITIONS, reverse=False)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def test_state_jacobian_and_scores_match_the_library_cache() -> None:
    model = tiny()
    wrapped = gradscope.wrap(model, positions=POSITIONS)
    core = wrapped.core
    assert list(core.state_layout()) == ["l0/conv", "l0/ssm", "l1/keys", "l1/values", "l3/conv", "l3/ssm"]
    conv = 2 * HIDDEN + 2 * GROUPS * STATE
    assert core.state_dim == 2 * (conv * (KERNEL - 1) + HEADS * HEAD_DIM * STATE) + 2 * POSITIONS * 2 * 4
    check_hybrid(family(model), wrapped, tokens, RTOL)


def test_the_bare_model() -> None:
    bare = tiny(bare=True)
    wrapped = gradscope.wrap(bare, positions=POSITIONS)
    assert wrapped.readout is None
    check_state_jacobian(family(bare), wrapped, tokens(4), 2, "vjp", RTOL)


def test_declared_blocks_and_the_heads_exponents_with_the_cache_held() -> None:
    """Every declared block equals J_t's own (torch.func) and J_t is lower-triangular over them; the spectrum,
    the cache held, has the recurrent blocks' entries only: P·N finite exponents a head (from its declared
    scalar decay) and the conv windows' −∞."""
    wrapped = gradscope.wrap(tiny(), positions=POSITIONS)
    check_held_spectrum(wrapped.core, wrapped.core_inputs(tokens(12, length=POSITIONS)),
                        finite=2 * HEADS * HEAD_DIM * STATE, minus_inf=2 * (2 * HIDDEN + 2 * GROUPS * STATE) * (KERNEL - 1))


def test_mixture_of_experts_blocks() -> None:
    """A MoE block (group-limited top-k router with its correction bias, latent projections, shared expert):
    J against the library's cache at two positions, both stability pairs, and the routing is the library's
    (its choice changes with the input, so a wrong rule changes J)."""
    model = tiny(pattern="M*EM", **MOE)
    wrapped = gradscope.wrap(model, positions=POSITIONS)
    assert list(wrapped.core.state_layout()) == ["l0/conv", "l0/ssm", "l1/keys", "l1/values", "l3/conv", "l3/ssm"]
    fam = family(model, MOE_TYPES)
    for p, method in ((1, "vjp"), (T - 1, "func")):
        check_state_jacobian(fam, wrapped, tokens(21), p, method, RTOL)
    check_stability(fam, wrapped, L=5, p=2, rtol=1e-6)
