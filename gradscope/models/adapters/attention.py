"""Attention layers' keys and values as part of the state: what a hybrid's or a transformer's attention
layer passes from step p to later steps.

A causal attention layer has no fixed-size state: step p passes on the keys and values of positions
0 … p (the KV cache). gradscope's state z is a flat vector of fixed width, so an adapter holds a cache of
``positions`` slots per attention layer, ``l<i>/keys`` and ``l<i>/values`` (positions, KV heads, head
dim), zero beyond the current step. Step t writes slot t (the new key, after its norm and rotary
embedding, and the new value) and attends over slots 0 … t. So the state at p is exactly (every
recurrent layer's state, every attention layer's keys and values at positions ≤ p), padded with slots
> p that are zero; a slot s > p is overwritten at step s, so ∂y_T/∂z_p is zero on it, and every score,
which sums over the state's entries, is the score of the unpadded state.

J_t's own block on a cache is diagonal: 1 on every slot but slot t, which the step overwrites (0). The
cache is **held**: the step map of a growing cache is not square, so Lyapunov and step spectra are
defined on the recurrent layers' states only, with the caches along the trajectory held as inputs
(:attr:`Entry.held`); the block-triangular structure makes those exponents the recurrent blocks' own.

A sequence longer than ``positions`` is refused in one line (``gradscope.wrap(model, positions=N)``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.base import Entry

POSITIONS = 64  # default slots per attention layer: the stability probes' default length (32) with margin


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) → (−x2, x1) over the last axis's halves: the rotary embedding's partner."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The rotary embedding on the first ``cos.shape[-1]`` entries of x (…, heads, d); cos, sin (B, rot)
    broadcast over the heads; the rest passes (partial rotary)."""
    r = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    rot, rest = x[..., :r], x[..., r:]
    out = rot * cos + rotate_half(rot) * sin
    return out if rest.shape[-1] == 0 else torch.cat([out, rest], dim=-1)


def rotary(embedding: nn.Module, like: Tensor, t: int) -> tuple[Tensor, Tensor]:
    """The library's rotary embedding module's (cos, sin) at position t, each (B, rot), in ``like``'s dtype."""
    B = like.shape[0]
    position = torch.full((B, 1), t, dtype=torch.long, device=like.device)
    cos, sin = embedding(like[:, None, :], position)
    return cos[:, 0].to(like.dtype), sin[:, 0].to(like.dtype)


def check_position(t: int | None, positions: int, family: str) -> int:
    """The step's time index, refused in one line beyond the cache's slots."""
    check(t is not None, f"{family}: the step needs its time index t (attention reads position t)")
    check(0 <= int(t) < positions,
          f"sequence: {family}'s attention cache holds {positions} positions and step {int(t) + 1} needs one "
          f"more; wrap the model with gradscope.wrap(model, positions=N) for longer sequences")
    return int(t)


def write_slot(cache: Tensor, new: Tensor, t: int) -> Tensor:
    """cache (B, positions, heads, d) with slot t replaced by new (B, heads, d), functionally (no in-place
    write: ``torch.func`` transforms it)."""
    slot = torch.arange(cache.shape[1], device=cache.device) == t
    return torch.where(slot[None, :, None, None], new[:, None], cache)


def attend(q: Tensor, keys: Tensor, values: Tensor, t: int, scaling: float) -> Tensor:
    """softmax(q kᵀ · scaling) v over slots 0 … t: q (B, Hq, d), keys/values (B, positions, Hkv, d) with
    Hq a multiple of Hkv (grouped queries: query head j reads KV head j // (Hq/Hkv)) → (B, Hq, d). The
    softmax in q's dtype (the libraries' eager path rounds it to float32)."""
    B, Hq, d = q.shape
    Hkv = keys.shape[2]
    k, v = keys[:, :t + 1], values[:, :t + 1]  # (B, t+1, Hkv, d)
    qg = q.reshape(B, Hkv, Hq // Hkv, d)
    scores = torch.einsum("bgrd,bsgd->bgrs", qg, k) * scaling
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("bgrs,bsgd->bgrd", weights, v).reshape(B, Hq, d)


def attention_step(a: nn.Module, hn: Tensor, keys: Tensor, values: Tensor, t: int, heads: int, kv_heads: int,
                   dim: int, *, rotary_emb: nn.Module | None = None,
                   norm: Callable[[nn.Module, Tensor], Tensor] | None = None, gated: bool = False,
                   key_scale: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """One attention step at position t of a transformers attention module ``a`` (``q_proj``, ``k_proj``,
    ``v_proj``, ``o_proj``, ``scaling``) on the normed stream hn (B, hidden), its caches (B, positions, kv_heads,
    dim) → (what it adds to the stream, keys', values'). ``norm(module, x)``: the per-head norm of ``a.q_norm``
    and ``a.k_norm`` where the module has them; ``rotary_emb``: the model's rotary embedding (None: no
    positional embedding, as Nemotron-H); ``gated``: ``q_proj`` gives each head's query and then its output
    gate, and the output is o ⊙ σ(gate) (Qwen3-Next); ``key_scale``: the key's multiplier, before its rotary
    embedding, as the library caches it (Falcon-H1's ``key_multiplier``)."""
    B = hn.shape[0]
    q = a.q_proj(hn).reshape(B, heads, (2 if gated else 1) * dim)
    gate = None
    if gated:
        q, gate = torch.chunk(q, 2, dim=-1)
    k = a.k_proj(hn).reshape(B, kv_heads, dim)
    if key_scale != 1.0:
        k = k * key_scale
    if norm is not None and hasattr(a, "q_norm"):
        q, k = norm(a.q_norm, q), norm(a.k_norm, k)
    if rotary_emb is not None:
        cos, sin = rotary(rotary_emb, hn, t)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
    keys, values = write_slot(keys, k, t), write_slot(values, a.v_proj(hn).reshape(B, kv_heads, dim), t)
    o = attend(q, keys, values, t, a.scaling).reshape(B, heads * dim)
    if gate is not None:
        o = o * torch.sigmoid(gate.reshape(B, heads * dim))
    return a.o_proj(o), keys, values


def cache_diagonal(batch: int, positions: int, width: int, t: int, like: Tensor) -> Tensor:
    """J_t's own diagonal block on a cache of ``positions`` slots of ``width`` entries: 1, but 0 on slot t."""
    keep = (torch.arange(positions, device=like.device) != t).to(like.dtype)
    return keep[:, None].expand(positions, width).reshape(1, -1).expand(batch, -1)


class CacheSlots:
    """Mixin of an adapter whose state holds attention caches: ``positions`` slots a layer, and the same core
    at another size (its ``__init__(backbone, positions)``; the library model by reference)."""

    positions: int

    def with_positions(self, positions: int):  # noqa: ANN201 - a core of the same class
        """The same model's core with ``positions`` attention cache slots."""
        return type(self)(self.model, positions)  # type: ignore[attr-defined, call-arg]


def cache_entries(i: int, positions: int, heads: int, dim: int) -> list[Entry]:
    """Attention layer i's state entries: its keys and values (positions, KV heads, head dim), held."""
    return [Entry(f"l{i}/{part}", (positions, heads, dim), "diagonal", held=True) for part in ("keys", "values")]


def check_positions(positions: object) -> int:
    """The number of cache slots, refused in one line unless a positive integer."""
    check(isinstance(positions, int) and not isinstance(positions, bool) and positions >= 1,
          f"positions: got {positions!r}; expected a positive number of attention cache slots")
    return int(positions)


__all__ = ["POSITIONS", "CacheSlots", "attend", "attention_step", "cache_diagonal", "cache_entries", "check_position",
           "check_positions", "rope", "rotary", "rotate_half", "write_slot"]
