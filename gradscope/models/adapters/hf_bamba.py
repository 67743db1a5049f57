"""transformers' Bamba (``BambaForCausalLM``, ``BambaModel``): Mamba-2 layers and attention layers, each followed
by a SwiGLU MLP, as a gradscope core.

One step per decoder layer, in the model's dtype::

    ĥ = RMSNorm(h)                                   # w · x / rms(x)
    Mamba-2 layer: the SSD step of :mod:`~gradscope.models.adapters.hf_mamba2` on ĥ (conv window, per-head
        matrix state S' = exp(Δ_h A_h) S + Δ_h x ⊗ B, grouped gated norm)
    attention layer: q, k, v = q_proj ĥ, k_proj ĥ, v_proj ĥ; rope(q, k, t) (partial); slot t of the cache
        ← (k, v); o = softmax(q Kᵀ/√d) V over slots ≤ t; out = o_proj(o)
    h += out;  h += down(silu(gate ĥ') ⊙ up ĥ')     # ĥ' = pre_ff_layernorm(h)

State layout, layer 0 first: a Mamba-2 layer has ``l<i>/conv`` and ``l<i>/ssm`` as in the Mamba-2 adapter; an
attention layer ``l<i>/keys``, ``l<i>/values`` (positions, KV heads, head dim), held
(:mod:`~gradscope.models.adapters.attention`). The step is position-dependent. Its Jacobian products are
``torch.func``'s (the Mamba-2 adapter's hand-derived products assume every layer is Mamba-2).

Output y_t: ``final_layernorm`` of the residual stream; readout: ``lm_head`` for ``BambaForCausalLM``.
"""

from __future__ import annotations

from types import SimpleNamespace

from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.attention import (POSITIONS, attention_step, cache_entries, check_position,
                                                 check_positions, cache_diagonal)
from gradscope.models.adapters.base import Adapted, LibraryCore, TokenMap, hf_forward
from gradscope.models.adapters.base import rms_norm as _norm
from gradscope.models.adapters.hf_mamba2 import Mamba2HybridCore
from gradscope.models.adapters.hf_qwen3_next import swiglu

TOLERANCE = 1e-4



class HFBambaCore(Mamba2HybridCore):
    """gradscope core over a transformers ``BambaModel`` (held by reference): the Mamba-2 adapter's SSD step on
    its Mamba layers, attention with its keys and values as state on the others."""

    name = "hf-bamba"
    label = "Bamba (transformers)"
    family = "Bamba"

    def __init__(self, backbone: nn.Module, positions: int = POSITIONS) -> None:
        cfg = backbone.config
        self.positions = check_positions(positions)
        self.types = tuple(cfg.layers_block_type[:cfg.num_hidden_layers])
        unknown = sorted(set(self.types) - {"linear_attention", "full_attention"})
        check(not unknown, f"model: layer types {unknown} are not ones the Bamba adapter knows")
        mamba = [layer.mamba for layer in backbone.layers if hasattr(layer, "mamba")]
        check(bool(mamba), "model: a Bamba without Mamba layers; wrap it as the transformer it is")
        self._mixer_dims(mamba[0], cfg)
        attn = next((layer.self_attn for layer in backbone.layers if hasattr(layer, "self_attn")), None)
        self.Hq, self.Hkv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.hd = int(attn.head_dim) if attn is not None else int(cfg.hidden_size // self.Hq)
        entries = []
        for i, kind in enumerate(self.types):
            entries += self._entries(i) if kind == "linear_attention" else \
                cache_entries(i, self.positions, self.Hkv, self.hd)
        LibraryCore.__init__(self, backbone, entries, int(cfg.hidden_size))
        self.num_layers = len(self.types)


    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B, d = x.shape[0], self.hd
        parts = self.unpack(z)
        new, diag = {}, {}
        h = x
        for i, layer in enumerate(self.model.layers[:self.num_layers]):
            if self.types[i] == "linear_attention":
                h = self._advance_layer(i, SimpleNamespace(norm=layer.input_layernorm, mixer=layer.mamba), h, parts,
                                        new, diag if diagonal else None)
            else:
                step = check_position(t, self.positions, self.family)
                out, keys, values = attention_step(layer.self_attn, _norm(layer.input_layernorm, h),
                                                   parts[f"l{i}/keys"], parts[f"l{i}/values"], step, self.Hq,
                                                   self.Hkv, d, rotary_emb=self.model.rotary_emb)
                new[f"l{i}/keys"], new[f"l{i}/values"] = keys, values
                h = h + out
                if diagonal:
                    for part in ("keys", "values"):
                        diag[f"l{i}/{part}"] = cache_diagonal(B, self.positions, self.Hkv * d, step, x)
            h = h + swiglu(layer.feed_forward, _norm(layer.pre_ff_layernorm, h))
        y = _norm(self.model.final_layernorm, h)
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []


def adapt(model: nn.Module, positions: int = POSITIONS) -> Adapted:
    """The adapter of a ``BambaForCausalLM``/``BambaModel``, with ``positions`` attention cache slots."""
    backbone = getattr(model, "model", model)
    check(hasattr(backbone, "layers") and hasattr(backbone, "embed_tokens"),
          f"model: {type(model).__name__} has no Bamba backbone (embed_tokens, layers)")
    return Adapted(HFBambaCore(backbone, positions), TokenMap(backbone.embed_tokens),
                   getattr(model, "lm_head", None), hf_forward(model), TOLERANCE)


__all__ = ["HFBambaCore", "TOLERANCE", "adapt"]
