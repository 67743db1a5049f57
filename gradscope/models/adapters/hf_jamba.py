"""transformers' Jamba (``JambaForCausalLM``, ``JambaModel``): Mamba-1 layers and attention layers, each followed
by a dense SwiGLU MLP or a mixture-of-experts MLP, as a gradscope core.

One step per decoder layer, as the library's one-token paths compute it, in the model's dtype (the library
rounds its SSM update and its router's softmax to float32; the adapter does not)::

    ĥ = RMSNorm(h)                                   # w · x / rms(x)
    Mamba layer (``mamba``; ``layers_block_type``):
        u, g    = in_proj(ĥ).chunk(2)                # (B, I) each
        c       = act(Σ_k w_k · [window, u]_k + b)   # depthwise causal conv over K inputs
        Δ, B, C = x_proj(c) split (R, N, N), each RMS-normalised with its own weight (dt_layernorm,
                  b_layernorm, c_layernorm: Jamba's difference from Mamba; Falcon-Mamba's are weightless)
        Δ       = softplus(dt_proj(Δ))               # (B, I)
        s'      = exp(Δ ⊙ A) ⊙ s + Δ B ⊙ c           # (B, I, N), A = −exp(A_log)
        out     = out_proj((s' C + D c) ⊙ silu(g));  window' = [window[1:], u]
    attention layer: q, k, v = q_proj ĥ, k_proj ĥ, v_proj ĥ (no positional embedding: Jamba has none); slot t
        of the cache ← (k, v); o = softmax(q Kᵀ/√d) V over slots ≤ t; out = o_proj(o)
    h += out;  h += MLP(pre_ff_layernorm(h))
    MLP: down(act(gate x) ⊙ up x), or on an expert layer (``layers_num_experts`` > 1) the sparse MoE:
        p = softmax(router x); the top-k experts' SwiGLUs weighted by their p, NOT renormalised over the k
        (``JambaTopKRouter``), and no shared expert.

State layout, layer 0 first: a Mamba layer has ``l<i>/conv`` (I, K−1): the last K−1 conv inputs per channel,
oldest first (transformers' cache keeps K, the oldest never read, so it is not part of z), and ``l<i>/ssm``
(I, N); an attention layer ``l<i>/keys`` and ``l<i>/values`` (positions, KV heads, head dim), held
(:mod:`~gradscope.models.adapters.attention`). Structure: the conv window is a shift register (a nilpotent
(K−1) × (K−1) block a channel, exponents −∞); the SSM block is diagonal, exp(Δ_i A_in); the caches are
diagonal (1, 0 on the slot the step writes) and held. The routing is piecewise constant in the state: its
derivative is that of the chosen experts' weights and outputs. The step is position-dependent (the cache slot).
Its Jacobian products are ``torch.func``'s.

Output y_t: ``final_layernorm`` of the residual stream; readout: ``lm_head`` for ``JambaForCausalLM``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.attention import (POSITIONS, CacheSlots, attention_step, cache_diagonal, cache_entries,
                                                 check_position, check_positions)
from gradscope.models.adapters.base import Adapted, Entry, LibraryCore, TokenMap, hf_forward, shift_blocks
from gradscope.models.adapters.base import rms_norm as _norm
from gradscope.models.adapters.hf_qwen3_next import swiglu

TOLERANCE = 1e-4
KINDS = ("mamba", "attention")



def jamba_moe(moe: nn.Module, x: Tensor) -> Tensor:
    """Jamba's sparse MoE block of one token per sequence, x (B, hidden), functionally: the softmax of the
    router's logits, its top-k experts weighted by their probabilities as they are (no renormalisation over the
    k, as ``JambaTopKRouter``), each expert's SwiGLU read by gathering its weights per token (no data-dependent
    loop, so torch.func transforms it); no shared expert."""
    router, experts = moe.router, moe.experts
    probs = torch.softmax(F.linear(x, router.weight), dim=-1)  # (B, E)
    top, index = torch.topk(probs, router.top_k, dim=-1)  # (B, k)
    gate, up = torch.einsum("bkoh,bh->bko", experts.gate_up_proj[index], x).chunk(2, dim=-1)  # (B, k, I) each
    act = experts.act_fn(gate) * up
    out = torch.einsum("bkhi,bki->bkh", experts.down_proj[index], act)  # (B, k, hidden)
    return (out * top[..., None]).sum(1)


def mlp_step(mlp: nn.Module, x: Tensor) -> Tensor:
    """A decoder layer's feed-forward on x (B, hidden): the sparse MoE where the layer has experts, else the SwiGLU."""
    return jamba_moe(mlp, x) if hasattr(mlp, "experts") else swiglu(mlp, x)


class HFJambaCore(CacheSlots, LibraryCore):
    """gradscope core over a transformers ``JambaModel`` (held by reference): the Mamba-1 step with Jamba's
    Δ/B/C norms on its Mamba layers, attention with its keys and values as state on the others."""

    name = "hf-jamba"
    label = "Jamba (transformers)"
    library = "transformers"
    family = "Jamba"
    position_dependent = True

    def __init__(self, backbone: nn.Module, positions: int = POSITIONS) -> None:
        cfg = backbone.config
        self.positions = check_positions(positions)
        self.types = tuple(str(k) for k in cfg.layers_block_type[:cfg.num_hidden_layers])
        unknown = sorted(set(self.types) - set(KINDS))
        check(not unknown, f"model: Jamba layer types {unknown} are not built (the adapter knows {', '.join(KINDS)})")
        check(len(backbone.layers) == len(self.types),
              f"model: {len(backbone.layers)} layers but the config types {len(self.types)}")
        mamba = [layer.mamba for layer in backbone.layers if hasattr(layer, "mamba")]
        check(bool(mamba),
              "model: a Jamba without Mamba layers has no recurrent state; wrap it as the transformer it is")
        m = mamba[0]
        self.I, self.N = int(m.intermediate_size), int(m.ssm_state_size)
        self.K, self.R = int(m.conv_kernel_size), int(m.time_step_rank)
        check(self.K >= 2, f"model: mamba_d_conv={self.K}; the adapter needs a causal conv of width >= 2")
        check(not hasattr(cfg, "_is_quantized"),
              "model: a quantized Jamba is not built (the adapter reads its weights as float tensors)")
        for layer in backbone.layers:
            ff = layer.feed_forward
            if hasattr(ff, "experts"):
                e = ff.experts
                check(not getattr(e, "has_bias", False) and not getattr(e, "is_transposed", False)
                      and getattr(e, "is_concatenated", True) and getattr(e, "has_gate", True),
                      "model: Jamba experts with biases or a transposed/interleaved gate_up layout are not built")
        self.Hq, self.Hkv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        attn = next((layer.self_attn for layer in backbone.layers if hasattr(layer, "self_attn")), None)
        self.hd = int(attn.head_dim) if attn is not None else int(cfg.hidden_size // self.Hq)
        entries: list[Entry] = []
        for i, kind in enumerate(self.types):
            if kind == "mamba":
                entries += [Entry(f"l{i}/conv", (self.I, self.K - 1), "block_diagonal", self.K - 1),
                            Entry(f"l{i}/ssm", (self.I, self.N), "diagonal")]
            else:
                entries += cache_entries(i, self.positions, self.Hkv, self.hd)
        LibraryCore.__init__(self, backbone, entries, int(cfg.hidden_size))
        self.num_layers = len(self.types)

    def _mamba(self, i: int, m: nn.Module, hn: Tensor, parts: dict[str, Tensor], new: dict[str, Tensor],
               diag: dict[str, Tensor] | None) -> Tensor:
        """Mamba layer i's mixer on the normed stream hn (B, hidden): its new state into ``new``, its diagonal
        blocks into ``diag`` (None: not asked); returns what it adds to the stream."""
        B = hn.shape[0]
        u, g = m.in_proj(hn).chunk(2, dim=-1)  # (B, I) each
        window = parts[f"l{i}/conv"]  # (B, I, K−1)
        full = torch.cat([window, u[..., None]], dim=-1)  # (B, I, K)
        c = (full * m.conv1d.weight[:, 0, :]).sum(-1)
        if m.conv1d.bias is not None:
            c = c + m.conv1d.bias
        c = m.act(c)
        dt, Bm, Cm = torch.split(m.x_proj(c), [self.R, self.N, self.N], dim=-1)
        dt, Bm, Cm = _norm(m.dt_layernorm, dt), _norm(m.b_layernorm, Bm), _norm(m.c_layernorm, Cm)
        dt = F.softplus(m.dt_proj(dt))  # (B, I)
        dA = torch.exp(dt[..., None] * -torch.exp(m.A_log))  # (B, I, N)
        s = dA * parts[f"l{i}/ssm"] + (dt * c)[..., None] * Bm[:, None, :]
        out = (s * Cm[:, None, :]).sum(-1) + m.D * c
        new[f"l{i}/conv"], new[f"l{i}/ssm"] = full[..., 1:], s
        if diag is not None:
            diag[f"l{i}/conv"] = shift_blocks(B, self.I, self.K - 1, hn)
            diag[f"l{i}/ssm"] = dA
        return m.out_proj(out * F.silu(g))

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B, d = x.shape[0], self.hd
        parts = self.unpack(z)
        new: dict[str, Tensor] = {}
        diag: dict[str, Tensor] = {}
        h = x
        for i, layer in enumerate(self.model.layers[:self.num_layers]):
            hn = _norm(layer.input_layernorm, h)
            if self.types[i] == "mamba":
                h = h + self._mamba(i, layer.mamba, hn, parts, new, diag if diagonal else None)
            else:
                step = check_position(t, self.positions, self.family)
                out, keys, values = attention_step(layer.self_attn, hn, parts[f"l{i}/keys"], parts[f"l{i}/values"],
                                                   step, self.Hq, self.Hkv, d)
                new[f"l{i}/keys"], new[f"l{i}/values"] = keys, values
                h = h + out
                if diagonal:
                    for part in ("keys", "values"):
                        diag[f"l{i}/{part}"] = cache_diagonal(B, self.positions, self.Hkv * d, step, x)
            h = h + mlp_step(layer.feed_forward, _norm(layer.pre_ff_layernorm, h))
        y = _norm(self.model.final_layernorm, h)
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []


def adapt(model: nn.Module, positions: int = POSITIONS) -> Adapted:
    """The adapter of a ``JambaForCausalLM``/``JambaModel``, with ``positions`` attention cache slots."""
    backbone = getattr(model, "model", model)
    check(hasattr(backbone, "layers") and hasattr(backbone, "embed_tokens") and hasattr(backbone, "final_layernorm"),
          f"model: {type(model).__name__} has no Jamba backbone (embed_tokens, layers, final_layernorm)")
    moe = any(hasattr(layer.feed_forward, "experts") for layer in backbone.layers)
    dtype = next(backbone.parameters()).dtype
    grouped = getattr(backbone.config, "_experts_implementation", None) == "grouped_mm"
    check(not (moe and grouped and dtype == torch.float64),
          "model: a float64 Jamba whose experts run transformers' grouped_mm, which takes no float64, so its own "
          "forward (the wrap-time check) cannot run; call model.set_experts_implementation('eager') first")
    return Adapted(HFJambaCore(backbone, positions), TokenMap(backbone.embed_tokens),
                   getattr(model, "lm_head", None), hf_forward(model), TOLERANCE)


__all__ = ["HFJambaCore", "TOLERANCE", "adapt", "jamba_moe"]
