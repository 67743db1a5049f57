"""transformers' Zamba2 (``Zamba2ForCausalLM``, ``Zamba2Model``): a stack of Mamba-2 layers, some of them preceded
by a shared transformer block, as a gradscope core.

One step per layer, in the model's dtype; e = x_t is the token's embedding (the core's input), h the residual
stream (h = e before layer 0); norms are w · x / rms(x)::

    hybrid layer i (the j-th hybrid layer; shared block b = j mod num_mem_blocks, with invocation j's adapters):
        ĉ = RMSNorm([h, e])                                  # (2·hidden): the stream beside the embedding
        q, k, v = (W ĉ + A_j ĉ for W, A_j in (q, k, v))       # A_j = up_j down_j: rank-r adapters (if used)
        rope(q, k, t) (use_mem_rope); slot t of layer i's cache ← (k, v)
        o = softmax(q Kᵀ / √(d/2)) V over slots ≤ t          # d = 2·hidden / heads: Zamba2 scales by d/2
        a = o_proj(o);  â = RMSNorm(a)
        g, u = chunk(gate_up â + A'_j â, 2);  τ = linear(down(act(g) ⊙ u))
        h += Mamba-2(RMSNorm(h + τ))                         # τ feeds the mixer's input, not the stream
    Mamba-2 layer:  h += Mamba-2(RMSNorm(h))
    Mamba-2: the SSD step of :mod:`~gradscope.models.adapters.hf_mamba2` (conv window, per-head matrix state
        S' = exp(Δ_h A_h) S + Δ_h x ⊗ B, output gated by silu(g) and then grouped-RMS-normed)

State layout, layer 0 first: a hybrid layer has its own ``l<i>/keys``, ``l<i>/values`` (positions, KV heads,
d) (each invocation of a shared block caches its own keys and values, as the library's cache does), held
(:mod:`~gradscope.models.adapters.attention`), then ``l<i>/conv`` and ``l<i>/ssm`` as in the Mamba-2 adapter
(the attention runs first, so J_t stays block lower-triangular); a Mamba-2 layer ``l<i>/conv``, ``l<i>/ssm``.
Position-dependent (the cache slot and the rotary embedding). Its Jacobian products are ``torch.func``'s.

Δ is clamped below at ``time_step_min`` as the library's full-sequence (chunked) forward does; the library's
one-token path does not clamp, so the two differ where softplus(Δ + dt_bias) < time_step_min.

Output y_t: ``final_layernorm`` of the residual stream; readout: ``lm_head`` for ``Zamba2ForCausalLM``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.attention import (POSITIONS, attend, cache_diagonal, cache_entries,
                                                 check_position, check_positions, rope, rotary, write_slot)
from gradscope.models.adapters.base import Adapted, LibraryCore, TokenMap, hf_forward, rms, shift_blocks
from gradscope.models.adapters.hf_mamba2 import Mamba2HybridCore

TOLERANCE = 1e-4
KINDS = ("linear_attention", "hybrid")


def _norm(module: nn.Module, x: Tensor) -> Tensor:
    return rms(x, module.variance_epsilon) * module.weight


def _adapted(proj: nn.Module, adapters: nn.ModuleList | None, j: int, x: Tensor) -> Tensor:
    """proj(x) plus invocation j's adapter on x (None: the block has no adapters there)."""
    return proj(x) if adapters is None else proj(x) + adapters[j](x)


class HFZamba2Core(Mamba2HybridCore):
    """gradscope core over a transformers ``Zamba2Model`` (held by reference): the Mamba-2 adapter's SSD step on
    every layer, and at the hybrid layers the shared transformer block with its keys and values as state."""

    name = "hf-zamba2"
    label = "Zamba2 (transformers)"
    family = "Zamba2"

    def __init__(self, backbone: nn.Module, positions: int = POSITIONS) -> None:
        cfg = backbone.config
        self.positions = check_positions(positions)
        self.types = tuple(str(k) for k in cfg.layers_block_type)
        unknown = sorted(set(self.types) - set(KINDS))
        check(not unknown, f"model: Zamba2 layer types {unknown} are not built (the adapter knows {', '.join(KINDS)})")
        check(len(self.types) == len(backbone.layers),
              f"model: {len(backbone.layers)} layers but {len(self.types)} layer types")
        self.mixers = [self._mamba(layer) for layer in backbone.layers]
        m = self.mixers[0].mixer
        # Zamba2's mixer is always SiLU (hidden_act is the shared MLP's) and clamps Δ at its own time_step_limit
        self._mixer_dims(m, SimpleNamespace(hidden_act="silu", time_step_limit=m.time_step_limit))
        rope_type = str((getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default"))
        check(not cfg.use_mem_rope or rope_type not in ("dynamic", "longrope"),
              f"model: rope_type={rope_type!r} rescales with the sequence's length; the Zamba2 adapter is not built "
              f"for it")
        self.Hq, self.Hkv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.hd = int(cfg.attention_head_dim)
        entries = []
        for i, kind in enumerate(self.types):
            if kind == "hybrid":
                entries += cache_entries(i, self.positions, self.Hkv, self.hd)
            entries += self._entries(i)
        LibraryCore.__init__(self, backbone, entries, int(cfg.hidden_size))
        self.num_layers = len(self.types)

    @staticmethod
    def _mamba(layer: nn.Module) -> SimpleNamespace:
        """A layer's Mamba-2 decoder as the SSD step reads it (``norm``, ``mixer``)."""
        dec = getattr(layer, "mamba_decoder", layer)
        return SimpleNamespace(norm=dec.input_layernorm, mixer=dec.mamba)

    def _shared(self, i: int, st: nn.Module, h: Tensor, e: Tensor, keys: Tensor, values: Tensor, t: int
                ) -> tuple[Tensor, Tensor, Tensor]:
        """Hybrid layer i's shared block ``st`` at step t on the stream h and the embedding e (B, hidden), its
        caches (B, positions, H_kv, d) → (what it adds to the Mamba-2 mixer's input, keys', values')."""
        B, d, a, mlp = h.shape[0], self.hd, st.self_attn, st.feed_forward
        j = a.layer_dic[i]  # the invocation: its adapters
        lora = self.model.config.use_shared_attention_adapter
        c = _norm(st.input_layernorm, torch.cat([h, e], dim=-1))  # (B, 2·hidden)
        q = _adapted(a.q_proj, a.linear_q_adapter_list if lora else None, j, c).reshape(B, self.Hq, d)
        k = _adapted(a.k_proj, a.linear_k_adapter_list if lora else None, j, c).reshape(B, self.Hkv, d)
        v = _adapted(a.v_proj, a.linear_v_adapter_list if lora else None, j, c).reshape(B, self.Hkv, d)
        if self.model.config.use_mem_rope:
            cos, sin = rotary(self.model.rotary_emb, h, t)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        keys, values = write_slot(keys, k, t), write_slot(values, v, t)
        o = a.o_proj(attend(q, keys, values, t, a.scaling).reshape(B, self.Hq * d))
        on = _norm(st.pre_ff_layernorm, o)
        g, u = torch.chunk(_adapted(mlp.gate_up_proj, mlp.gate_up_proj_adapter_list, mlp.layer_dic[i], on), 2, dim=-1)
        return mlp.down_proj(mlp.act_fn(g) * u), keys, values

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B = x.shape[0]
        parts = self.unpack(z)
        new, diag = {}, {}
        h = x
        for i, layer in enumerate(self.model.layers):
            h_in = h
            if self.types[i] == "hybrid":
                step = check_position(t, self.positions, self.family)
                tau, keys, values = self._shared(i, layer.shared_transformer, h, x, parts[f"l{i}/keys"],
                                                 parts[f"l{i}/values"], step)
                new[f"l{i}/keys"], new[f"l{i}/values"] = keys, values
                h_in = h + layer.linear(tau)
                if diagonal:
                    for part in ("keys", "values"):
                        diag[f"l{i}/{part}"] = cache_diagonal(B, self.positions, self.Hkv * self.hd, step, x)
            window = parts[f"l{i}/conv"]
            L = self._layer(self.mixers[i], h_in, window, parts[f"l{i}/ssm"])
            new[f"l{i}/conv"] = torch.cat([window[..., 1:], L.xbc[..., None]], dim=-1)
            new[f"l{i}/ssm"] = L.s
            if diagonal:
                diag[f"l{i}/conv"] = shift_blocks(B, self.C, self.K - 1, x)
                diag[f"l{i}/ssm"] = L.a[..., None, None].expand(B, self.H, self.P, self.N)
            h = h + L.res  # the residual is the layer's input stream, without the shared block's τ
        y = _norm(self.model.final_layernorm, h)
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []


def adapt(model: nn.Module, positions: int = POSITIONS) -> Adapted:
    """The adapter of a ``Zamba2ForCausalLM``/``Zamba2Model``, with ``positions`` attention cache slots per
    hybrid layer."""
    backbone = getattr(model, "model", model)
    check(hasattr(backbone, "layers") and hasattr(backbone, "embed_tokens") and hasattr(backbone, "final_layernorm"),
          f"model: {type(model).__name__} has no Zamba2 backbone (embed_tokens, layers, final_layernorm)")
    return Adapted(HFZamba2Core(backbone, positions), TokenMap(backbone.embed_tokens),
                   getattr(model, "lm_head", None), hf_forward(model), TOLERANCE)


__all__ = ["HFZamba2Core", "TOLERANCE", "adapt"]
