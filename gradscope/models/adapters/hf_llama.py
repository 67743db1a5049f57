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
defined on it unchanged (SPEC §8); the step spectra, gates and Lyapunov spectrum are not (there is no
recurrent state), and ``dynamics`` says so in one line. The step is position-dependent.

Output y_t: the backbone's last hidden state (``norm`` of the residual stream); readout: ``lm_head`` for a
``…ForCausalLM``. Sliding-window layers (a Qwen3 option) are refused in one line.
"""

from __future__ import annotations

from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.attention import (POSITIONS, attend, check_position, held_blocks, rope, rotary,
                                                 write_slot)
from gradscope.models.adapters.base import Adapted, Entry, LibraryCore, TokenMap, hf_forward, rms
from gradscope.models.adapters.hf_qwen3_next import swiglu

TOLERANCE = 1e-4


def norm(module: nn.Module, x: Tensor) -> Tensor:
    """Llama's RMSNorm in x's dtype: w · x / rms(x)."""
    return rms(x, module.variance_epsilon) * module.weight


class HFLlamaCore(LibraryCore):
    """gradscope core over a transformers ``LlamaModel`` or ``Qwen3Model`` (held by reference)."""

    name = "hf-llama"
    label = "Llama-style transformer (transformers)"
    library = "transformers"
    family = "transformer"
    position_dependent = True

    def __init__(self, backbone: nn.Module, positions: int = POSITIONS) -> None:
        cfg = backbone.config
        check(isinstance(positions, int) and positions >= 1, f"positions: got {positions!r}; expected a positive "
                                                              f"number of attention cache slots")
        kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        check(kinds <= {"full_attention"}, f"model: layer types {sorted(kinds)}: the adapter knows full causal "
                                           f"attention only (no sliding windows)")
        self.family = "Qwen3" if hasattr(backbone.layers[0].self_attn, "q_norm") else "Llama"
        self.Hq, self.Hkv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.Hq)
        self.positions = int(positions)
        self.num_layers = int(cfg.num_hidden_layers)
        entries = [Entry(f"l{i}/{part}", (self.positions, self.Hkv, self.hd), "diagonal", held=True)
                   for i in range(self.num_layers) for part in ("keys", "values")]
        super().__init__(backbone, entries, int(cfg.hidden_size))

    def with_positions(self, positions: int) -> "HFLlamaCore":
        """The same model's core with ``positions`` attention cache slots (the library model by reference)."""
        return type(self)(self.model, positions)

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B, d = x.shape[0], self.hd
        step = check_position(t, self.positions, self.family)
        parts = self.unpack(z)
        new, diag = {}, {}
        h = x
        cos = sin = None
        for i, layer in enumerate(self.model.layers[:self.num_layers]):
            a = layer.self_attn
            hn = norm(layer.input_layernorm, h)
            q = a.q_proj(hn).reshape(B, self.Hq, d)
            k = a.k_proj(hn).reshape(B, self.Hkv, d)
            if hasattr(a, "q_norm"):  # Qwen3: an RMSNorm over each head
                q, k = norm(a.q_norm, q), norm(a.k_norm, k)
            if cos is None:
                cos, sin = rotary(self.model.rotary_emb, hn, step)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            keys = write_slot(parts[f"l{i}/keys"], k, step)
            values = write_slot(parts[f"l{i}/values"], a.v_proj(hn).reshape(B, self.Hkv, d), step)
            new[f"l{i}/keys"], new[f"l{i}/values"] = keys, values
            h = h + a.o_proj(attend(q, keys, values, step, a.scaling).reshape(B, self.Hq * d))
            h = h + swiglu(layer.mlp, norm(layer.post_attention_layernorm, h))
            if diagonal:
                for part in ("keys", "values"):
                    diag[f"l{i}/{part}"] = held_blocks(B, self.positions, self.Hkv * d, step, x)
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
