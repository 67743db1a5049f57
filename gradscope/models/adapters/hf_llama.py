"""transformers' Llama and Qwen3 transformers (``LlamaForCausalLM``, ``LlamaModel``, ``Qwen3ForCausalLM``,
``Qwen3Model``) as a gradscope core: a pure transformer, whose whole state is its attention caches.

One step per decoder layer, as the library's one-token path computes it, in the model's dtype (the library
runs its RMSNorms and softmax in float32; the adapter does not)::

    ĥ = RMSNorm(h)                                    # w · x / rms(x)
    q, k, v = q_proj ĥ, k_proj ĥ, v_proj ĥ            # Qwen3: q, k = RMSNorm(q), RMSNorm(k) per head
    q, k = rope(q, k, t);  slot t of the cache ← (k, v);  o = softmax(q Kᵀ/√d) V over slots ≤ t
    h += o_proj(o);  h += down(act(gate ĥ') ⊙ up ĥ')   # ĥ' = RMSNorm(h)

State layout: per layer ``l<i>/keys`` and ``l<i>/values`` (positions, KV heads, head dim): the KV cache
(:mod:`~gradscope.models.adapters.attention`), every block held. Stability and the gradient flow are
defined on it unchanged (docs/definitions.md §8); the step spectra, gates and Lyapunov spectrum are not (there is no
recurrent state), and ``dynamics`` says so in one line. The step is position-dependent.

Output y_t: the backbone's last hidden state (``norm`` of the residual stream); readout: ``lm_head`` for a
``…ForCausalLM``. Sliding-window layers (a Qwen3 option) are refused in one line.
"""

from __future__ import annotations

from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.attention import (POSITIONS, CacheSlots, attention_step, cache_entries, check_position,
                                                 check_positions, cache_diagonal)
from gradscope.models.adapters.base import Adapted, LibraryCore, TokenMap, hf_forward
from gradscope.models.adapters.base import rms_norm as norm
from gradscope.models.adapters.hf_qwen3_next import swiglu

TOLERANCE = 1e-4



class HFLlamaCore(CacheSlots, LibraryCore):
    """gradscope core over a transformers ``LlamaModel`` or ``Qwen3Model`` (held by reference)."""

    name = "hf-llama"
    label = "Llama-style transformer (transformers)"
    library = "transformers"
    family = "transformer"
    position_dependent = True

    def __init__(self, backbone: nn.Module, positions: int = POSITIONS) -> None:
        cfg = backbone.config
        kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        check(kinds <= {"full_attention"}, f"model: layer types {sorted(kinds)}: the adapter knows full causal "
                                           f"attention only (no sliding windows)")
        self.family = "Qwen3" if hasattr(backbone.layers[0].self_attn, "q_norm") else "Llama"
        self.Hq, self.Hkv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.Hq)
        self.positions = check_positions(positions)
        self.num_layers = int(cfg.num_hidden_layers)
        entries = [e for i in range(self.num_layers) for e in cache_entries(i, self.positions, self.Hkv, self.hd)]
        super().__init__(backbone, entries, int(cfg.hidden_size))


    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B, d = x.shape[0], self.hd
        step = check_position(t, self.positions, self.family)
        parts = self.unpack(z)
        new, diag = {}, {}
        h = x
        for i, layer in enumerate(self.model.layers[:self.num_layers]):
            out, keys, values = attention_step(layer.self_attn, norm(layer.input_layernorm, h), parts[f"l{i}/keys"],
                                               parts[f"l{i}/values"], step, self.Hq, self.Hkv, d,
                                               rotary_emb=self.model.rotary_emb, norm=norm)
            new[f"l{i}/keys"], new[f"l{i}/values"] = keys, values
            h = h + out
            h = h + swiglu(layer.mlp, norm(layer.post_attention_layernorm, h))
            if diagonal:
                for part in ("keys", "values"):
                    diag[f"l{i}/{part}"] = cache_diagonal(B, self.positions, self.Hkv * d, step, x)
        y = norm(self.model.norm, h)
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []


def adapt(model: nn.Module, positions: int = POSITIONS) -> Adapted:
    """The adapter of a ``LlamaForCausalLM``/``LlamaModel``/``Qwen3ForCausalLM``/``Qwen3Model``, with ``positions``
    attention cache slots."""
    backbone = getattr(model, "model", model)
    check(hasattr(backbone, "layers") and hasattr(backbone, "embed_tokens"),
          f"model: {type(model).__name__} has no Llama-style backbone (embed_tokens, layers)")
    return Adapted(HFLlamaCore(backbone, positions), TokenMap(backbone.embed_tokens),
                   getattr(model, "lm_head", None), hf_forward(model), TOLERANCE)


__all__ = ["HFLlamaCore", "TOLERANCE", "adapt"]
