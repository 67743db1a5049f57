"""gradscope.wrap(transformers BambaForCausalLM / BambaModel): Mamba-2 layers and an attention layer whose keys and
values are part of the state, against a float64 brute force through transformers' own forward and cache
(tests/helpers/adapterkit.py): J = ∂y_T/∂z_p, the state's size, S(A, A) = 1, the declared blocks against
torch.func's J_t, and the Mamba-2 heads' exponents with the cache held (issue #49)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from tests.helpers.adapterkit import Family, check_stability, check_state_jacobian  # noqa: E402

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
    """Bamba's cache in the documented layout: per Mamba layer the conv window without its oldest input and the
    (heads, P, N) state; per attention layer keys and values (positions, H_kv, d), zero-padded. The library's
    one-token path, token by token, with explicit positions (its forward does not count the cache's); J by
    forward mode, as for Mamba-2 (its one-token path writes the state in place)."""
    bb = getattr(model, "model", model)

    def read(cache) -> list[torch.Tensor]:  # noqa: ANN001
        out = []
        for l, kind in enumerate(TYPES):
            layer = cache.layers[l]
            if kind == "linear_attention":
                out += [layer.conv_states[0][:, :, 1:].double(), layer.recurrent_states[0].double()]
            else:
                for kv in (layer.keys, layer.values):
                    pad = kv.new_zeros(kv.shape[0], kv.shape[1], POSITIONS - kv.shape[2], kv.shape[3])
                    out.append(torch.cat([kv, pad], dim=2).transpose(1, 2))
        return out

    def state(tokens: torch.Tensor) -> list[torch.Tensor]:
        return [q.clone() for q in read(bb(input_ids=tokens, use_cache=True).cache)]

    def step(parts: list[torch.Tensor], columns: torch.Tensor, t0: int):  # noqa: ANN202
        with torch.no_grad():
            cache = bb(input_ids=columns[:, :1], use_cache=True).cache
        it = iter(parts)
        for l, kind in enumerate(TYPES):
            layer = cache.layers[l]
            if kind == "linear_attention":
                window = next(it)
                layer.conv_states[0] = torch.cat([torch.zeros_like(window[:, :, :1]), window], dim=-1)
                layer.recurrent_states[0] = next(it).clone()
            else:
                layer.keys, layer.values = (next(it)[:, :t0].transpose(1, 2).contiguous() for _ in range(2))
        for t in range(columns.shape[1]):
            pos = torch.full((columns.shape[0], 1), t0 + t, dtype=torch.long)
            y = bb(input_ids=columns[:, t:t + 1], cache=cache, use_cache=True, position_ids=pos).last_hidden_state[:, -1]
        return y, read(cache)

    return Family(model, state, step, V, reverse=False)  # the SSD one-token path writes its state in place


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def test_state_jacobian_and_scores_match_the_library_cache() -> None:
    model = tiny()
    wrapped = gradscope.wrap(model, positions=POSITIONS)
    core = wrapped.core
    assert list(core.state_layout()) == ["l0/conv", "l0/ssm", "l1/keys", "l1/values", "l2/conv", "l2/ssm"]
    conv = 2 * HIDDEN + 2 * GROUPS * STATE
    assert core.state_dim == 2 * (conv * (KERNEL - 1) + HEADS * HEAD_DIM * STATE) + 2 * POSITIONS * 2 * (HIDDEN // 4)
    fam = family(model)
    for p, method in ((1, "vjp"), (3, "func"), (T - 1, "auto")):
        check_state_jacobian(fam, wrapped, tokens(1), p, method, RTOL)
    check_stability(fam, wrapped, L=5, p=2, rtol=1e-6)
    from gradscope.analysis.scores import default_score
    jac = gradscope.state_jacobian(wrapped, tokens(5), position=3).jac
    assert torch.allclose(default_score(jac, jac), torch.ones(B, dtype=jac.dtype), rtol=0, atol=1e-12)


def test_the_bare_model() -> None:
    bare = tiny(bare=True)
    wrapped = gradscope.wrap(bare, positions=POSITIONS)
    assert wrapped.readout is None
    check_state_jacobian(family(bare), wrapped, tokens(4), 2, "vjp", RTOL)


def test_declared_blocks_and_the_heads_exponents_with_the_cache_held() -> None:
    """Every declared block equals J_t's own (torch.func) and J_t is lower-triangular over them; the
    spectrum (the cache held) is each Mamba-2 head's mean log decay P·N times and the conv windows' −∞."""
    import math

    from gradscope.analysis.lyapunov import lyapunov_spectrum
    from gradscope.models.core import diagonal_blocks, generic_step_jacobian, initial_state, step_at

    model = tiny()
    wrapped = gradscope.wrap(model, positions=POSITIONS)
    core = wrapped.core
    x = wrapped.core_inputs(tokens(12, length=POSITIONS))
    with torch.no_grad():
        z = initial_state(core, B, x)
        for t in range(4):
            J = generic_step_jacobian(core, x[:, t], z, t)
            for blk, d in zip(core.jacobian_structure().blocks, diagonal_blocks(core, x[:, t], z, t), strict=True):
                own = J[:, blk.start:blk.stop, blk.start:blk.stop]
                if blk.form == "diagonal":
                    dense = torch.diag_embed(d.expand(B, blk.width))
                else:
                    dense = torch.stack([torch.block_diag(*d[b]) for b in range(B)])
                torch.testing.assert_close(own, dense, rtol=1e-10, atol=1e-12, msg=f"{blk.name} at t={t}")
                later = J[:, blk.start:blk.stop, blk.stop:]
                assert later.numel() == 0 or float(later.abs().max()) == 0.0, blk.name
            z = step_at(core, x[:, t], z, t)[1]
        lam = lyapunov_spectrum(core, x, warmup=2).exponents
    recurrent = 2 * ((2 * HIDDEN + 2 * GROUPS * STATE) * (KERNEL - 1) + HEADS * HEAD_DIM * STATE)
    assert lam.shape == (B, recurrent)
    assert int(torch.isfinite(lam[0]).sum()) == 2 * HEADS * HEAD_DIM * STATE
    assert int((lam[0] == -math.inf).sum()) == 2 * (2 * HIDDEN + 2 * GROUPS * STATE) * (KERNEL - 1)
