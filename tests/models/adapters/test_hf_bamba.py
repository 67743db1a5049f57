"""gradscope.wrap(transformers BambaForCausalLM / BambaModel): Mamba-2 layers and an attention layer whose keys and
values are part of the state, against a float64 brute force through transformers' own forward and cache
(tests/helpers/adapterkit.py): J = ∂y_T/∂z_p, the state's size, S(A, A) = 1, the declared blocks against
torch.func's J_t, and the Mamba-2 heads' exponents with the cache held (issue #49)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from tests.helpers.adapterkit import (Family, check_held_spectrum, check_hybrid,  # noqa: E402
                                      check_state_jacobian, hybrid_family)

B, T, V, POSITIONS = 2, 6, 30, 10
RTOL = 2e-6  # transformers runs its SSD scan, norms and softmax in float32 even for a float64 model
HIDDEN, HEADS, HEAD_DIM, GROUPS, STATE, KERNEL = 16, 4, 8, 2, 4, 3
TYPES = ["linear_attention", "full_attention", "linear_attention"]


def tiny(bare: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.BambaConfig(vocab_size=V, hidden_size=HIDDEN, num_hidden_layers=3, attn_layer_indices=[1],
                                   mamba_n_heads=HEADS, mamba_d_head=HEAD_DIM, mamba_n_groups=GROUPS,
                                   mamba_d_state=STATE, mamba_d_conv=KERNEL, mamba_expand=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=24, mamba_chunk_size=4,
                                   attn_implementation="eager")
    model = (transformers.BambaModel if bare else transformers.BambaForCausalLM)(cfg).eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(10)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".D"):
                p.uniform_(0.5, 1.5, generator=gen)
            elif "dt_bias" in name or "conv1d.bias" in name:
                p.normal_(0.0, 0.5, generator=gen)
    return model.double()


def family(model: torch.nn.Module) -> Family:
    """The library's cache in the documented layout (tests/helpers/adapterkit.hybrid_family); J by forward mode,
    as for Mamba-2 (its one-token path writes the state in place), with explicit positions (its forward
    does not count the cache's)."""
    return hybrid_family(model, TYPES, POSITIONS, reverse=False, explicit_positions=True)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def test_state_jacobian_and_scores_match_the_library_cache() -> None:
    model = tiny()
    wrapped = gradscope.wrap(model, positions=POSITIONS)
    core = wrapped.core
    assert list(core.state_layout()) == ["l0/conv", "l0/ssm", "l1/keys", "l1/values", "l2/conv", "l2/ssm"]
    conv = 2 * HIDDEN + 2 * GROUPS * STATE
    assert core.state_dim == 2 * (conv * (KERNEL - 1) + HEADS * HEAD_DIM * STATE) + 2 * POSITIONS * 2 * (HIDDEN // 4)
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
