"""transformers' RecurrentGemma (``RecurrentGemmaForCausalLM``, ``RecurrentGemmaModel``) with recurrent
(Griffin/Hawk RG-LRU) blocks only, as a gradscope core.

**Attention blocks are refused** (one line): a local-attention block's state is its window of keys
and values (``attention_window_size`` tokens), not a recurrent state of fixed meaning per step, so
published RecurrentGemma configurations (two recurrent blocks, then one attention block) cannot be
wrapped; configurations with ``block_types=["recurrent"]`` (Hawk) can.

One step per residual block, as ``RecurrentGemmaRecurrentBlock``'s decoding path computes it, in the
model's dtype (the library accumulates the RG-LRU in float32 and its RMSNorms in float32)::

    x̂ = RMSNorm(h);  y = gelu(W_y x̂);  u = W_x x̂
    c = Σ_k w_k · [window, u]_k + b                     # depthwise causal conv over K inputs
    i, r = σ(blockdiag(W_i) c + b_i), σ(blockdiag(W_a) c + b_a)   # per head
    a = exp(−8 r softplus(Λ));   s' = a ⊙ s + sqrt(1 − a²) ⊙ (i ⊙ c)   (t > 0)
                                 s' = i ⊙ c                              (t = 0: the library's reset)
    h += W_o (s' ⊙ y);  h += MLP(RMSNorm(h));  window' = [window[1:], u]

It is **position-dependent** (the reset at t = 0): ``position_dependent = True`` and ``step(x, z, t)``.
The library's ``SqrtBoundDerivative`` (a legacy ``autograd.Function``: torch.func cannot go through it)
is replaced by a plain-torch equivalent with the same value and the same clipped derivative,
1 / sqrt(max(4x, 1e-6)).

State layout, layer 0 first: ``l<i>/conv`` (W, K−1): the last K−1 conv inputs per channel, oldest first
(all read); ``l<i>/rglru`` (W). Structure: the conv window is a shift register (per channel a nilpotent
block, exponents −∞), the RG-LRU block is diagonal a (0 at t = 0); block lower-triangular.

Inputs: the library's embedding times its normaliser sqrt(hidden) (as the library rounds it, in
bfloat16); output y_t: ``final_norm`` of the residual stream; readout: ``lm_head`` and the logit soft cap.
Wrap-time check: logits within 1e-4 of the library's own forward (relative to their largest magnitude,
at least 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.base import Adapted, Entry, LibraryCore, TokenMap, hf_forward, rms, shift_blocks

TOLERANCE = 1e-4
MAX_SQRT_GRADIENT = 1000.0  # transformers' _MAX_SQRT_GRADIENT


def sqrt_bound(x: Tensor) -> Tensor:
    """sqrt(x), with the derivative clipped as transformers' SqrtBoundDerivative clips it:
    1 / sqrt(max(4x, 1/MAX²)). Plain torch (a stop-gradient trick), so torch.func transforms it."""
    slope = torch.rsqrt(torch.clamp(4.0 * x, min=1.0 / MAX_SQRT_GRADIENT ** 2)).detach()
    return torch.sqrt(x).detach() + (x - x.detach()) * slope


def _norm(module: nn.Module, x: Tensor) -> Tensor:
    """RecurrentGemmaRMSNorm in x's dtype: x / rms(x) · (1 + weight)."""
    return rms(x, module.eps) * (1.0 + module.weight)


class HFRecurrentGemmaCore(LibraryCore):
    """gradscope core over a transformers ``RecurrentGemmaModel`` with recurrent blocks only (held by reference)."""

    name = "hf-recurrentgemma"
    label = "RecurrentGemma (transformers)"
    library = "transformers"
    family = "RecurrentGemma"
    position_dependent = True

    def __init__(self, rg: nn.Module) -> None:
        cfg = rg.config
        for i, layer in enumerate(rg.layers):
            kind = type(layer.temporal_block).__name__
            check(hasattr(layer.temporal_block, "rg_lru"),
                  f"model: layer {i} of this RecurrentGemma is a local-attention block ({kind}); the adapter "
                  f"covers recurrent blocks only (block_types=['recurrent'], i.e. Hawk); an attention block's "
                  f"state is its window of {cfg.attention_window_size} keys and values")
        tb = rg.layers[0].temporal_block
        self.W, self.K = int(tb.lru_width), int(tb.conv1d_width)
        self.heads = int(tb.rg_lru.num_attention_heads)
        check(self.K >= 2, f"model: conv1d_width={self.K}; the adapter needs a causal conv of width >= 2")
        entries = []
        for i in range(len(rg.layers)):
            entries += [Entry(f"l{i}/conv", (self.W, self.K - 1), "block_diagonal", self.K - 1),
                        Entry(f"l{i}/rglru", (self.W,), "diagonal")]
        super().__init__(rg, entries, int(cfg.hidden_size))
        self.num_layers = len(rg.layers)

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        if t is None:
            raise TypeError("RecurrentGemma's step needs its time index t (the recurrence resets at t = 0)")
        B = x.shape[0]
        parts = self.unpack(z)
        new, diag = {}, {}
        h = x
        for i, layer in enumerate(self.model.layers):
            tb = layer.temporal_block
            lru = tb.rg_lru
            xn = _norm(layer.temporal_pre_norm, h)
            yb = tb.act_fn(tb.linear_y(xn))
            u = tb.linear_x(xn)  # (B, W)
            full = torch.cat([parts[f"l{i}/conv"], u[..., None]], dim=-1)  # (B, W, K)
            c = (full * tb.conv_1d.weight[:, 0, :]).sum(-1) + tb.conv_1d.bias
            ch = c.reshape(B, self.heads, -1)
            gate_x = torch.sigmoid(torch.einsum("bhi,hij->bhj", ch, lru.input_gate_weight) + lru.input_gate_bias)
            gate_a = torch.sigmoid(torch.einsum("bhi,hij->bhj", ch, lru.recurrent_gate_weight) + lru.recurrent_gate_bias)
            log_a = -8.0 * gate_a.reshape(B, -1) * F.softplus(lru.recurrent_param)
            gated = c * gate_x.reshape(B, -1)
            if t == 0:  # the library's reset at position 0: no decay, no normalisation
                a = torch.zeros_like(log_a)
                s = gated
            else:
                a = torch.exp(log_a)
                s = a * parts[f"l{i}/rglru"] + gated * sqrt_bound(1 - torch.exp(2 * log_a))
            residual = tb.linear_out(s * yb) + h
            h = layer.mlp_block(_norm(layer.channel_pre_norm, residual)) + residual
            new[f"l{i}/conv"], new[f"l{i}/rglru"] = full[..., 1:], s
            if diagonal:
                diag[f"l{i}/conv"] = shift_blocks(B, self.W, self.K - 1, x)
                diag[f"l{i}/rglru"] = a
        y = _norm(self.model.final_norm, h)
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []


class SoftCappedHead(nn.Module):
    """``lm_head`` then tanh(·/cap)·cap (held by reference)."""

    def __init__(self, lm_head: nn.Module, cap: float) -> None:
        super().__init__()
        self.lm_head, self.cap = lm_head, float(cap)

    def forward(self, y: Tensor) -> Tensor:
        return torch.tanh(self.lm_head(y) / self.cap) * self.cap


def adapt(model: nn.Module) -> Adapted:
    """The adapter of a ``RecurrentGemmaForCausalLM``/``RecurrentGemmaModel`` (recurrent blocks only)."""
    rg = getattr(model, "model", model)
    check(hasattr(rg, "layers") and hasattr(rg, "final_norm"), f"model: {type(model).__name__} has no RecurrentGemma body")
    core = HFRecurrentGemmaCore(rg)
    inputs = TokenMap(rg.embed_tokens, scale=lambda x: rg.normalizer.type(x.dtype))
    head = getattr(model, "lm_head", None)
    readout = None if head is None else SoftCappedHead(head, model.config.logits_soft_cap)
    return Adapted(core, inputs, readout, hf_forward(model), TOLERANCE)


__all__ = ["HFRecurrentGemmaCore", "SoftCappedHead", "TOLERANCE", "adapt", "sqrt_bound"]
