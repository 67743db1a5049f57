"""The attention layers' step and cache (gradscope/models/adapters/attention.py) on their own, against a plain
float64 reference written here head by head: softmax(q·k · scaling) over the slots 0 … t, query head j reading KV
head j // (Hq/Hkv), the rotary embedding as a rotation of the pairs (i, i + rot/2), the cache written at slot t, and
J_t's own block on a cache. No library is imported: the attention module is a stand-in with the attributes
attention_step reads. The adapters' agreement with each library is tests/models/adapters/test_hf_*.py's."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from gradscope.errors import GradscopeError
from gradscope.models.adapters.attention import (POSITIONS, CacheSlots, attend, attention_step, cache_diagonal,
                                                 cache_entries, check_position, check_positions, rope, rotary,
                                                 rotate_half, write_slot)

F64 = torch.float64
B, P, D, HIDDEN = 2, 5, 4, 6  # batch, cache slots, head dim, stream width
TOL = 1e-12
BASE = 100.0  # the stand-in rotary embedding's base


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- references -----------------------------------------------------------------------------------------------

def ref_rope(x: Tensor, t: int, rot: int) -> Tensor:
    """x (B, heads, d) at position t: the pairs (x_i, x_{i+rot/2}), i < rot/2, rotated by t · BASE^(−2i/rot)."""
    out = x.clone()
    half = rot // 2
    for i in range(half):
        a = t * BASE ** (-2 * i / rot)
        c, s = math.cos(a), math.sin(a)
        out[..., i] = x[..., i] * c - x[..., i + half] * s
        out[..., i + half] = x[..., i + half] * c + x[..., i] * s
    return out


def ref_attend(q: Tensor, keys: Tensor, values: Tensor, t: int, scaling: float) -> Tensor:
    """q (B, Hq, d), keys/values (B, P, Hkv, d) → (B, Hq, d), one sequence and one head at a time."""
    Bq, Hq, d = q.shape
    group = Hq // keys.shape[2]
    out = torch.zeros_like(q)
    for b in range(Bq):
        for j in range(Hq):
            kv = j // group
            scores = torch.stack([scaling * torch.dot(q[b, j], keys[b, s, kv]) for s in range(t + 1)])
            w = torch.exp(scores - scores.max())
            w = w / w.sum()
            out[b, j] = sum(w[s] * values[b, s, kv] for s in range(t + 1))
    return out


def ref_rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


# --- stand-ins for a library's modules --------------------------------------------------------------------------

class Rotary(nn.Module):
    """A rotary embedding as the libraries call it: (x (B, 1, …), position (B, 1)) → (cos, sin) (B, 1, rot)."""

    def __init__(self, rot: int) -> None:
        super().__init__()
        self.inv_freq = BASE ** (-torch.arange(0, rot, 2, dtype=F64) / rot)

    def forward(self, x: Tensor, position: Tensor) -> tuple[Tensor, Tensor]:
        angles = position[..., None].to(F64) * self.inv_freq  # (B, 1, rot/2)
        emb = torch.cat([angles, angles], dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class Norm(nn.Module):
    def __init__(self, dim: int, seed: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + torch.rand(dim, generator=gen(seed), dtype=F64))
        self.variance_epsilon = 1e-6


class Attention(nn.Module):
    """The attributes attention_step reads: q/k/v/o projections (with biases), ``scaling``, optional q/k norms."""

    def __init__(self, heads: int, kv_heads: int, gated: bool, norms: bool, seed: int = 0) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, heads * D * (2 if gated else 1), dtype=F64)
        self.k_proj = nn.Linear(HIDDEN, kv_heads * D, dtype=F64)
        self.v_proj = nn.Linear(HIDDEN, kv_heads * D, dtype=F64)
        self.o_proj = nn.Linear(heads * D, HIDDEN, dtype=F64)
        with torch.no_grad():
            g = gen(seed)
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=F64))
        self.scaling = 0.37  # not 1/sqrt(d): the module's own scaling must be the one used
        if norms:
            self.q_norm, self.k_norm = Norm(D, seed + 1), Norm(D, seed + 2)


def norm_fn(module: nn.Module, x: Tensor) -> Tensor:
    return ref_rms(x, module.weight, module.variance_epsilon)


def caches(kv_heads: int, seed: int = 3) -> tuple[Tensor, Tensor]:
    """Keys and values (B, P, Hkv, d), nonzero in every slot (those past t must be ignored)."""
    g = gen(seed)
    shape = (B, P, kv_heads, D)
    return torch.randn(shape, generator=g, dtype=F64), torch.randn(shape, generator=g, dtype=F64)


# --- rotary embedding --------------------------------------------------------------------------------------------

def test_rotate_half_swaps_the_halves_and_negates_the_second() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    assert rotate_half(x).tolist() == [[-4.0, -5.0, -6.0, 1.0, 2.0, 3.0]]


@pytest.mark.parametrize("rot", [D, 2])  # full and partial rotary
def test_rope_rotates_the_pairs_and_passes_the_rest(rot: int) -> None:
    t = 3
    x = torch.randn(B, 3, D, generator=gen(1), dtype=F64)
    cos, sin = Rotary(rot)(x[:, :1, 0], torch.full((B, 1), t))
    out = rope(x, cos[:, 0], sin[:, 0])
    torch.testing.assert_close(out, ref_rope(x, t, rot), rtol=0, atol=TOL)
    assert torch.equal(out[..., rot:], x[..., rot:])
    torch.testing.assert_close(out[..., :rot].norm(dim=-1), x[..., :rot].norm(dim=-1), rtol=0, atol=TOL)  # a rotation
    zero = torch.zeros(B, rot, dtype=F64)
    assert torch.equal(rope(x, zero + 1, zero), x)  # position 0: the identity


def test_rotary_asks_the_embedding_for_position_t_and_casts() -> None:
    """The module is called once with (like[:, None, :], a (B, 1) long tensor of t); its float32 (B, 1, rot)
    output comes back as (B, rot) in like's dtype."""
    calls = []

    class Fixed(nn.Module):
        def forward(self, x: Tensor, position: Tensor) -> tuple[Tensor, Tensor]:
            calls.append((x, position))
            row = torch.tensor([0.5, -0.25, 0.125, 1.0], dtype=torch.float32)
            return row.expand(x.shape[0], 1, 4), (2 * row).expand(x.shape[0], 1, 4)

    like = torch.randn(B, HIDDEN, generator=gen(0), dtype=F64)
    cos, sin = rotary(Fixed(), like, 7)
    assert len(calls) == 1 and torch.equal(calls[0][0], like[:, None, :])
    assert calls[0][1].dtype == torch.long and calls[0][1].tolist() == [[7]] * B
    assert cos.dtype == sin.dtype == F64 and cos.shape == sin.shape == (B, 4)
    assert cos.tolist() == [[0.5, -0.25, 0.125, 1.0]] * B and sin.tolist() == [[1.0, -0.5, 0.25, 2.0]] * B


# --- the cache ---------------------------------------------------------------------------------------------------

def test_write_slot_replaces_slot_t_only_and_leaves_the_cache() -> None:
    cache, _ = caches(2)
    before = cache.clone()
    new = torch.randn(B, 2, D, generator=gen(4), dtype=F64)
    out = write_slot(cache, new, 2)
    assert torch.equal(cache, before)  # functional: no in-place write
    assert torch.equal(out[:, 2], new)
    keep = [0, 1, 3, 4]
    assert torch.equal(out[:, keep], cache[:, keep])


def test_the_cache_diagonal_is_the_write_s_own_jacobian() -> None:
    """J_t's block on a cache (torch.func.jacrev of write_slot with respect to the cache) is diagonal: 1 on every
    slot but slot t, 0 there; cache_diagonal gives that diagonal, per sequence."""
    kv, t = 2, 3
    width = kv * D
    new = torch.randn(kv, D, generator=gen(4), dtype=F64)
    cache = torch.randn(P, kv, D, generator=gen(5), dtype=F64)
    jac = torch.func.jacrev(lambda c: write_slot(c[None], new[None], t)[0].reshape(-1))(cache).reshape(P * width, -1)
    diag = jac.diagonal()
    assert torch.equal(jac, torch.diag(diag))
    got = cache_diagonal(B, P, width, t, cache)
    assert got.shape == (B, P * width) and got.dtype == F64
    assert torch.equal(got, diag.expand(B, -1))
    assert got.sum() == B * (P - 1) * width


def test_the_cache_entries_are_held_diagonal_keys_and_values() -> None:
    keys, values = cache_entries(3, 8, 2, D)
    assert (keys.name, values.name) == ("l3/keys", "l3/values")
    for e in (keys, values):
        assert e.shape == (8, 2, D) and e.form == "diagonal" and e.held and e.width == 8 * 2 * D


# --- attention -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2), (4, 1)])  # multi-head, grouped, multi-query
@pytest.mark.parametrize("t", [0, 2, P - 1])
def test_attend_is_softmax_attention_over_slots_up_to_t(heads: int, kv_heads: int, t: int) -> None:
    q = torch.randn(B, heads, D, generator=gen(2), dtype=F64)
    keys, values = caches(kv_heads)
    out = attend(q, keys, values, t, 0.37)
    assert out.shape == (B, heads, D)
    torch.testing.assert_close(out, ref_attend(q, keys, values, t, 0.37), rtol=0, atol=TOL)
    later = keys.clone(), values.clone()  # what slots past t hold does not matter, exactly
    later[0][:, t + 1:] += 10
    later[1][:, t + 1:] -= 10
    assert torch.equal(attend(q, *later, t, 0.37), out)
    if t == 0:  # one slot: weight 1 on it, each query head reads its group's value
        assert torch.equal(out, values[:, 0].repeat_interleave(heads // kv_heads, dim=1))


def test_attend_uses_the_scaling_it_is_given() -> None:
    q = torch.randn(B, 2, D, generator=gen(2), dtype=F64)
    keys, values = caches(2)
    torch.testing.assert_close(attend(q, keys, values, 3, 2.0), attend(2 * q, keys, values, 3, 1.0), rtol=0, atol=TOL)
    assert (attend(q, keys, values, 3, 2.0) - attend(q, keys, values, 3, 1.0)).abs().max() > 1e-3


def ref_step(a: Attention, hn: Tensor, keys: Tensor, values: Tensor, t: int, heads: int, kv_heads: int,
             rot: int | None, norms: bool, gated: bool, key_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """The step from the projections' weights: per head q (and its gate), k scaled, normed, rotated; v."""
    qa = hn @ a.q_proj.weight.T + a.q_proj.bias
    width = 2 * D if gated else D
    q = torch.stack([qa[:, j * width:j * width + D] for j in range(heads)], dim=1)  # (B, heads, d)
    k = (hn @ a.k_proj.weight.T + a.k_proj.bias).reshape(B, kv_heads, D) * key_scale
    v = (hn @ a.v_proj.weight.T + a.v_proj.bias).reshape(B, kv_heads, D)
    if norms:
        q = ref_rms(q, a.q_norm.weight, a.q_norm.variance_epsilon)
        k = ref_rms(k, a.k_norm.weight, a.k_norm.variance_epsilon)
    if rot is not None:
        q, k = ref_rope(q, t, rot), ref_rope(k, t, rot)
    keys, values = keys.clone(), values.clone()
    keys[:, t], values[:, t] = k, v
    o = ref_attend(q, keys, values, t, a.scaling).reshape(B, heads * D)
    if gated:
        gate = torch.cat([qa[:, j * width + D:(j + 1) * width] for j in range(heads)], dim=1)
        o = o * torch.sigmoid(gate)
    return o @ a.o_proj.weight.T + a.o_proj.bias, keys, values


CASES = [  # heads, kv_heads, rotary width (None: no positional embedding), q/k norms, gated output, key multiplier
    (4, 2, D, False, False, 1.0),  # a Llama/Jamba-like grouped layer
    (4, 1, 2, True, True, 1.0),  # partial rotary, per-head norms, an output gate (Qwen3-Next)
    (2, 2, None, False, False, 0.5),  # no rotary (Nemotron-H), a key multiplier (Falcon-H1)
]


@pytest.mark.parametrize("heads,kv_heads,rot,norms,gated,key_scale", CASES)
@pytest.mark.parametrize("t", [0, 3])
def test_attention_step_is_the_reference_step(heads: int, kv_heads: int, rot: int | None, norms: bool, gated: bool,
                                              key_scale: float, t: int) -> None:
    a = Attention(heads, kv_heads, gated, norms)
    hn = torch.randn(B, HIDDEN, generator=gen(6), dtype=F64)
    keys, values = caches(kv_heads)
    with torch.no_grad():
        out, k2, v2 = attention_step(a, hn, keys, values, t, heads, kv_heads, D,
                                     rotary_emb=None if rot is None else Rotary(rot),
                                     norm=norm_fn if norms else None, gated=gated, key_scale=key_scale)
        ref_out, ref_k, ref_v = ref_step(a, hn, keys, values, t, heads, kv_heads, rot, norms, gated, key_scale)
    assert out.shape == (B, HIDDEN) and k2.shape == v2.shape == keys.shape
    torch.testing.assert_close(out, ref_out, rtol=0, atol=TOL)
    torch.testing.assert_close(k2, ref_k, rtol=0, atol=TOL)
    torch.testing.assert_close(v2, ref_v, rtol=0, atol=TOL)
    others = [s for s in range(P) if s != t]
    assert torch.equal(k2[:, others], keys[:, others]) and torch.equal(v2[:, others], values[:, others])


def test_attention_step_without_a_norm_function_ignores_the_modules_norms() -> None:
    """``norm=None`` (a family without per-head norms) leaves q and k as projected, whatever the module holds."""
    a = Attention(2, 2, gated=False, norms=True)
    hn = torch.randn(B, HIDDEN, generator=gen(6), dtype=F64)
    keys, values = caches(2)
    with torch.no_grad():
        out = attention_step(a, hn, keys, values, 2, 2, 2, D)[0]
        ref = ref_step(a, hn, keys, values, 2, 2, 2, None, False, False, 1.0)[0]
    torch.testing.assert_close(out, ref, rtol=0, atol=TOL)


# --- refusals and sizes --------------------------------------------------------------------------------------------

def test_check_position_returns_t_and_refuses_in_one_line() -> None:
    assert check_position(0, 4, "jamba") == 0 and check_position(3, 4, "jamba") == 3
    with pytest.raises(GradscopeError, match="jamba: the step needs its time index t") as err:
        check_position(None, 4, "jamba")
    assert "\n" not in str(err.value)
    with pytest.raises(GradscopeError, match=r"jamba's attention cache holds 4 positions and step 5 needs one more; "
                                             r"wrap the model with gradscope.wrap\(model, positions=N\)") as err:
        check_position(4, 4, "jamba")
    assert str(err.value).startswith("sequence: ") and "\n" not in str(err.value)
    with pytest.raises(GradscopeError, match="holds 4 positions"):
        check_position(-1, 4, "jamba")


@pytest.mark.parametrize("bad", [0, -3, True, 2.0, "4", None])
def test_check_positions_refuses_anything_but_a_positive_int(bad: object) -> None:
    with pytest.raises(GradscopeError, match=f"positions: got {bad!r}; expected a positive number") as err:
        check_positions(bad)
    assert "\n" not in str(err.value)


def test_check_positions_returns_the_count() -> None:
    assert check_positions(1) == 1 and check_positions(POSITIONS) == POSITIONS == 64


def test_with_positions_builds_the_same_class_on_the_same_model() -> None:
    class Slotted(CacheSlots):
        def __init__(self, model: object, positions: int) -> None:
            self.model, self.positions = model, positions

    model = object()
    core = Slotted(model, 4)
    other = core.with_positions(9)
    assert type(other) is Slotted and other.model is model and other.positions == 9 and core.positions == 4
