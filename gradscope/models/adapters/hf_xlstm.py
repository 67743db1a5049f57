"""transformers' xLSTM (``xLSTMForCausalLM``, ``xLSTMModel``: mLSTM blocks) as a gradscope core.

One step per block, as transformers' native ``mlstm_recurrent_step_native`` and ``xLSTMBlock`` compute
it, in the model's dtype (transformers keeps the state in ``inference_state_dtype``, float32 by default,
and its RMSNorms reduce in float32; the adapter does neither)::

    x̂ = RMSNorm(h);  q, k, v, o = projections of x̂ (per head: dqk, dqk, dv);  ĩ, f̃ = softcap(gates(x̂))
    m' = max(logσ(f̃) + m, ĩ);   F = exp(logσ(f̃) + m − m');   I = exp(ĩ − m')        (per head)
    C' = F C + I k vᵀ;   n' = F n + I k
    h̃ = (q̂ C') / (max(|q̂ · n'|, exp(−m')) + eps),   q̂ = q / sqrt(dqk)
    h += out_proj(σ(o) ⊙ MultiHeadLayerNorm(h̃));   h += FFN(RMSNorm(h))

Coordinates: the library's own (C, n, m), m the stabiliser (running log-scale), starting at zero as
in ``xLSTMCache``. State layout, block 0 first: ``l<i>/m`` (heads), ``l<i>/C`` (heads, dqk, dv),
``l<i>/n`` (heads, dqk). Structure: all diagonal, lower-triangular in that order: ∂m'/∂m is 1 where
the forget branch wins the maximum (then F = 1 too: ∂C'/∂C = ∂n'/∂n = 1) and 0 where the input gate
does; ∂C'/∂C = ∂n'/∂n = F per head. So in these coordinates det J_t = 1 on every forget-branch step,
the exponents are ≤ 0 (= 0 when the forget branch always wins), and a dense Benettin estimate can
show λ₁ > 0 from the off-diagonal ∂C'/∂m terms; see docs/models-from-libraries.md.

Shapes come from the layers' own projections (the config's ``qk_head_dim`` rounds to multiples of 64
and disagrees with the layers for small models; transformers' own cache then has the wrong shape).

Output y_t: ``out_norm`` of the residual stream; readout: ``lm_head`` then the library's logit soft cap.
Wrap-time check: logits within 1e-4 of the library's full-sequence forward (relative to their largest
magnitude, at least 1). The external ``xlstm`` package's blocks (used by transformers when installed)
are refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.base import Adapted, Entry, LibraryCore, TokenMap, hf_forward, rms

TOLERANCE = 1e-4


def _norm(module: nn.Module, x: Tensor) -> Tensor:
    """xLSTMRMSNorm in x's dtype: x / rms(x) · weight + bias."""
    y = rms(x, module.eps)
    if module.weight is not None:
        y = y * module.weight
    return y + module.bias if module.bias is not None else y


def _soft_cap(x: Tensor, cap: float | None) -> Tensor:
    return x if cap is None else cap * torch.tanh(x / cap)


class HFxLSTMCore(LibraryCore):
    """gradscope core over a transformers ``xLSTMModel`` (native mLSTM blocks, held by reference)."""

    name = "hf-xlstm"
    label = "xLSTM (transformers)"
    library = "transformers"
    family = "xLSTM"

    def __init__(self, backbone: nn.Module) -> None:
        cfg = backbone.config
        layer = backbone.blocks[0].mlstm_layer
        check(hasattr(layer, "mlstm_backend") and hasattr(layer, "multihead_norm"),
              "model: these xLSTM blocks come from the external xlstm package, which the adapter does not know; "
              "uninstall xlstm so that transformers uses its native mLSTM")
        self.heads = int(cfg.num_heads)
        self.dqk, self.dv = int(layer.qk_dim) // self.heads, int(layer.v_dim) // self.heads
        self.eps, self.cap = float(cfg.eps), cfg.gate_soft_cap
        entries = []
        for i in range(len(backbone.blocks)):
            entries += [Entry(f"l{i}/m", (self.heads,), "diagonal"),
                        Entry(f"l{i}/C", (self.heads, self.dqk, self.dv), "diagonal"),
                        Entry(f"l{i}/n", (self.heads, self.dqk), "diagonal")]
        super().__init__(backbone, entries, int(cfg.hidden_size))
        self.num_layers = len(backbone.blocks)

    def _projections(self, layer: nn.Module, x: Tensor) -> tuple[Tensor, ...]:
        if layer.config.weight_mode == "single":
            q, k, v, o = layer.q(x), layer.k(x), layer.v(x), layer.ogate_preact(x)
            i, f = _soft_cap(layer.igate_preact(x), self.cap), _soft_cap(layer.fgate_preact(x), self.cap)
        else:
            q, k, v, o = torch.tensor_split(layer.qkv_opreact(x), (layer.qk_dim, 2 * layer.qk_dim,
                                                                   2 * layer.qk_dim + layer.v_dim), dim=-1)
            i, f = torch.tensor_split(_soft_cap(layer.ifgate_preact(x), self.cap), (self.heads,), dim=-1)
        B = x.shape[0]
        return (q.reshape(B, self.heads, self.dqk), k.reshape(B, self.heads, self.dqk),
                v.reshape(B, self.heads, self.dv), o, i, f)

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B = x.shape[0]
        parts = self.unpack(z)
        new, diag = {}, {}
        h = x
        for l, block in enumerate(self.model.blocks):
            layer = block.mlstm_layer
            q, k, v, o, ig, fg = self._projections(layer, _norm(block.norm_mlstm, h))
            m, C, n = parts[f"l{l}/m"], parts[f"l{l}/C"], parts[f"l{l}/n"]
            logf = F.logsigmoid(fg)  # (B, heads)
            forget = logf + m
            m_new = torch.maximum(forget, ig)
            Fa, Ia = torch.exp(forget - m_new), torch.exp(ig - m_new)
            C_new = Fa[..., None, None] * C + Ia[..., None, None] * (k[..., :, None] * v[..., None, :])
            n_new = Fa[..., None] * n + Ia[..., None] * k
            qs = q * self.dqk ** -0.5
            num = (qs[..., None] * C_new).sum(-2)  # (B, heads, dv)
            den = torch.maximum((qs * n_new).sum(-1).abs(), torch.exp(-m_new)) + self.eps
            ht = num / den[..., None]
            mh = layer.multihead_norm
            centred = ht - ht.mean(-1, keepdim=True)
            hn = (centred * torch.rsqrt(ht.var(-1, keepdim=True, unbiased=False) + mh.eps)).reshape(B, -1)
            if mh.weight is not None:
                hn = hn * mh.weight
            if mh.bias is not None:
                hn = hn + mh.bias
            h = h + layer.out_proj(torch.sigmoid(o) * hn)
            h = h + block.ffn(_norm(block.norm_ffn, h))
            new[f"l{l}/m"], new[f"l{l}/C"], new[f"l{l}/n"] = m_new, C_new, n_new
            if diagonal:
                wins = (forget > ig).to(x.dtype) + 0.5 * (forget == ig).to(x.dtype)  # torch.maximum's derivative
                diag[f"l{l}/m"] = wins
                diag[f"l{l}/C"] = Fa[..., None, None].expand(B, self.heads, self.dqk, self.dv)
                diag[f"l{l}/n"] = Fa[..., None].expand(B, self.heads, self.dqk)
        y = _norm(self.model.out_norm, h)
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []


class SoftCappedHead(nn.Module):
    """``lm_head`` then the library's output soft cap (held by reference)."""

    def __init__(self, lm_head: nn.Module, cap: float | None) -> None:
        super().__init__()
        self.lm_head, self.cap = lm_head, cap

    def forward(self, y: Tensor) -> Tensor:
        return _soft_cap(self.lm_head(y), self.cap)


def adapt(model: nn.Module) -> Adapted:
    """The adapter of an ``xLSTMForCausalLM``/``xLSTMModel``."""
    backbone = getattr(model, "backbone", model)
    check(hasattr(backbone, "blocks") and hasattr(backbone, "out_norm"),
          f"model: {type(model).__name__} has no xLSTM backbone")
    head = getattr(model, "lm_head", None)
    readout = None if head is None else SoftCappedHead(head, model.config.output_logit_soft_cap)
    return Adapted(HFxLSTMCore(backbone), TokenMap(backbone.embeddings), readout, hf_forward(model), TOLERANCE)


__all__ = ["HFxLSTMCore", "SoftCappedHead", "TOLERANCE", "adapt"]
