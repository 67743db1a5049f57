"""transformers' Falcon-H1 (``FalconH1ForCausalLM``, ``FalconH1Model``): in every decoder layer a Mamba-2 mixer and
an attention layer side by side on the same normed input, then a gated MLP, with the model's μP multipliers, as a
gradscope core.

One step per decoder layer, in the model's dtype (the multipliers are the modules' own, read from the config)::

    ĥ = RMSNorm(h)                                         # w · x / rms(x)
    Mamba-2 mixer on ĥ · ssm_in_multiplier:
        g, xBC, Δ = (in_proj(·) ⊙ mup_vector) split (I, I + 2GN, H)   # mup_vector: ssm_multipliers per part
        the SSD step of :mod:`~gradscope.models.adapters.hf_mamba2` (conv window, per-head matrix state
            S' = exp(Δ_h A_h) S + Δ_h x ⊗ B, y = S' C + D x)
        y ⊙ silu(g), or with ``mamba_rms_norm`` the grouped gated norm (before or after the gate, as
            ``mamba_norm_before_gate`` says); m = out_proj(·)
    attention on ĥ · attention_in_multiplier: q, k · key_multiplier, v; rope(q, k, t); slot t of the cache ← (k, v);
        o = softmax(q Kᵀ/√d) V over slots ≤ t; a = o_proj(o)
    h += ssm_out_multiplier · m + attention_out_multiplier · a
    h += down(up ĥ' ⊙ silu(gate_multiplier · gate ĥ')) · down_multiplier      # ĥ' = pre_ff_layernorm(h)

State layout, layer 0 first, four entries a layer: ``l<i>/conv`` and ``l<i>/ssm`` as in the Mamba-2 adapter, then
``l<i>/keys``, ``l<i>/values`` (positions, KV heads, head dim), held (:mod:`~gradscope.models.adapters.attention`).
The attention half reads no part of its own layer's Mamba state (they run in parallel), so J_t stays block
lower-triangular in that order. The step is position-dependent. Its Jacobian products are ``torch.func``'s.

Inputs: ``embed_tokens`` · embedding_multiplier. Output y_t: ``final_layernorm`` of the residual stream; readout:
``lm_head`` · lm_head_multiplier for ``FalconH1ForCausalLM``.

Δ is clamped to ``time_step_limit`` as the library's full-sequence forward does (its one-token path does not clamp;
the default limit (0, ∞) makes the two the same).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.attention import (POSITIONS, attention_step, cache_diagonal, cache_entries,
                                                 check_position, check_positions)
from gradscope.models.adapters.base import Adapted, LibraryCore, TokenMap, hf_forward, rms, shift_blocks
from gradscope.models.adapters.base import rms_norm as _norm
from gradscope.models.adapters.hf_mamba2 import SILU, Mamba2HybridCore

TOLERANCE = 1e-4



class HFFalconH1Core(Mamba2HybridCore):
    """gradscope core over a transformers ``FalconH1Model`` (held by reference): per layer the Mamba-2 adapter's
    SSD step with Falcon-H1's multipliers and attention with its keys and values as state, side by side."""

    name = "hf-falcon-h1"
    label = "Falcon-H1 (transformers)"
    family = "Falcon-H1"

    def __init__(self, backbone: nn.Module, positions: int = POSITIONS) -> None:
        cfg = backbone.config
        self.positions = check_positions(positions)
        layers = backbone.layers
        check(len(layers) >= 1 and all(hasattr(lay, "mamba") and hasattr(lay, "self_attn") for lay in layers),
              "model: a Falcon-H1 layer without its Mamba-2 mixer and attention; this variant is not built")
        self._mixer_dims(layers[0].mamba, cfg)
        check(str(cfg.hidden_act) in SILU, f"model: hidden_act={cfg.hidden_act!r}; the adapter knows Falcon-H1's SiLU")
        attn = layers[0].self_attn
        self.Hq, self.Hkv, self.hd = int(cfg.num_attention_heads), int(cfg.num_key_value_heads), int(attn.head_dim)
        check(attn.q_proj.out_features == self.Hq * self.hd and attn.k_proj.out_features == self.Hkv * self.hd,
              f"model: attention projections of {attn.q_proj.out_features} and {attn.k_proj.out_features} features "
              f"are not {self.Hq} and {self.Hkv} heads of {self.hd}; this Falcon-H1 variant is not built")
        entries = []
        for i in range(len(layers)):
            entries += self._entries(i) + cache_entries(i, self.positions, self.Hkv, self.hd)
        LibraryCore.__init__(self, backbone, entries, int(cfg.hidden_size))
        self.num_layers = len(layers)

    def _mixer(self, m: nn.Module, hn: Tensor, window: Tensor, s_prev: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Falcon-H1's Mamba-2 mixer one step on the normed stream hn (B, hidden), its conv window (B, C, K−1) and
        matrix state (B, H, P, N): (its output, the conv input xBC, each head's decay a (B, H), the new state)."""
        B = hn.shape[0]
        proj = m.in_proj(hn * m.ssm_in_multiplier) * m.mup_vector.reshape(-1)
        g, xbc, raw = torch.split(proj, [self.I, self.C, self.H], dim=-1)
        pre = (torch.cat([window, xbc[..., None]], dim=-1) * m.conv1d.weight[:, 0, :]).sum(-1)  # (B, C)
        if m.conv1d.bias is not None:
            pre = pre + m.conv1d.bias
        xs, Bm, Cm = torch.split(F.silu(pre), [self.I, self.G * self.N, self.G * self.N], dim=-1)
        dt, _ = self._dt(m, raw)  # (B, H)
        a = torch.exp(dt * -torch.exp(m.A_log))  # (B, H): each head's one decay
        xh, Bh, Ch = xs.reshape(B, self.H, self.P), self._heads(Bm), self._heads(Cm)
        s = a[..., None, None] * s_prev + (dt[..., None] * xh)[..., None] * Bh[:, :, None, :]
        y = ((s * Ch[:, :, None, :]).sum(-1) + m.D[:, None] * xh).reshape(B, self.I)
        if m.mamba_rms_norm:  # the grouped gated norm, the gate before or after it
            nm, G = m.norm, int(m.norm.n_groups)
            if not nm.norm_before_gate:
                y = y * F.silu(g)
            y = rms(y.reshape(B, G, self.I // G), nm.variance_epsilon).reshape(B, self.I) * nm.weight
            if nm.norm_before_gate:
                y = y * F.silu(g)
        else:
            y = y * F.silu(g)
        return m.out_proj(y), xbc, a, s

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B = x.shape[0]
        step = check_position(t, self.positions, self.family)
        parts = self.unpack(z)
        new, diag = {}, {}
        h = x
        for i, layer in enumerate(self.model.layers[:self.num_layers]):
            hn = _norm(layer.input_layernorm, h)
            window = parts[f"l{i}/conv"]
            m, xbc, a, s = self._mixer(layer.mamba, hn, window, parts[f"l{i}/ssm"])
            new[f"l{i}/conv"], new[f"l{i}/ssm"] = torch.cat([window[..., 1:], xbc[..., None]], dim=-1), s
            o, new[f"l{i}/keys"], new[f"l{i}/values"] = attention_step(
                layer.self_attn, hn * layer.attention_in_multiplier, parts[f"l{i}/keys"], parts[f"l{i}/values"], step,
                self.Hq, self.Hkv, self.hd, rotary_emb=self.model.rotary_emb,
                key_scale=float(layer.self_attn.key_multiplier))
            h = h + (m * layer.ssm_out_multiplier + o * layer.attn_out_multiplier)
            ff = layer.feed_forward
            hf = _norm(layer.pre_ff_layernorm, h)
            h = h + ff.down_proj(ff.up_proj(hf) * F.silu(ff.gate_proj(hf) * ff.gate_multiplier)) * ff.down_multiplier
            if diagonal:
                diag[f"l{i}/conv"] = shift_blocks(B, self.C, self.K - 1, x)
                diag[f"l{i}/ssm"] = a[..., None, None].expand(B, self.H, self.P, self.N)
                for part in ("keys", "values"):
                    diag[f"l{i}/{part}"] = cache_diagonal(B, self.positions, self.Hkv * self.hd, step, x)
        y = _norm(self.model.final_layernorm, h)
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []


class ScaledHead(nn.Module):
    """``lm_head`` (held by reference) times the model's ``lm_head_multiplier``."""

    def __init__(self, lm_head: nn.Module, multiplier: float) -> None:
        super().__init__()
        self.lm_head, self.multiplier = lm_head, float(multiplier)

    def forward(self, y: Tensor) -> Tensor:
        return self.lm_head(y) * self.multiplier


def adapt(model: nn.Module, positions: int = POSITIONS) -> Adapted:
    """The adapter of a ``FalconH1ForCausalLM``/``FalconH1Model``, with ``positions`` attention cache slots."""
    backbone = getattr(model, "model", model)
    check(all(hasattr(backbone, n) for n in ("layers", "embed_tokens", "final_layernorm", "rotary_emb")),
          f"model: {type(model).__name__} has no Falcon-H1 backbone (embed_tokens, layers, final_layernorm)")
    inputs = TokenMap(backbone.embed_tokens, scale=lambda x: x.new_tensor(float(backbone.embedding_multiplier)))
    head = getattr(model, "lm_head", None)
    readout = None if head is None else ScaledHead(head, backbone.lm_head_multiplier)
    return Adapted(HFFalconH1Core(backbone, positions), inputs, readout, hf_forward(model), TOLERANCE)


__all__ = ["HFFalconH1Core", "ScaledHead", "TOLERANCE", "adapt"]
