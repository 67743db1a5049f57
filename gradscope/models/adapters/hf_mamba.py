"""transformers' Mamba (``MambaForCausalLM``, ``MambaModel``) and Falcon-Mamba (the same mixer plus
weightless RMSNorms on Δ, B and C) as a gradscope core.

One step per layer l, as ``MambaMixer.slow_forward``'s one-token path computes it, in the model's
dtype (the library rounds its SSM update to float32; the adapter does not)::

    u, g   = in_proj(RMSNorm(h)).chunk(2)               # (B, I) each; h the residual stream
    c      = silu(Σ_k w_k · [window, u]_k + b)           # depthwise causal conv over K inputs
    Δ, B, C = x_proj(c) split (R, N, N)                  # Falcon-Mamba: RMS-normalised each
    Δ      = softplus(dt_proj(Δ))                        # (B, I)
    s'     = exp(Δ ⊙ A) ⊙ s + Δ B ⊙ c                    # (B, I, N), A = −exp(A_log)
    h     += out_proj((s' C + D c) ⊙ silu(g))
    window' = [window[1:], u]

State layout, layer 0 first: ``l<i>/conv`` (I, K−1): the last K−1 conv inputs per channel, oldest
first — transformers caches K of them, but the oldest is never read, so it is not part of z;
``l<i>/ssm`` (I, N). Structure: the conv window is a shift register (per channel a nilpotent
(K−1) × (K−1) block: its exponents are −∞); the SSM block is diagonal, exp(Δ_i A_in); a layer's
SSM reads its own window, and layer l reads layers < l: block lower-triangular.

Output y_t: the backbone's last hidden state (``norm_f`` of the residual stream); readout: ``lm_head``
for ``…ForCausalLM`` (logits), none for ``…Model``.

Wrap-time check: logits within 1e-4 of the library's full-sequence forward, relative to their
largest magnitude (at least 1). The library's forward rounds to float32 in places (its SSM scan
products, RMSNorm, the logits) even in float64, hence not tighter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.base import Adapted, Entry, LibraryCore, TokenMap, hf_forward, rms, shift_blocks

TOLERANCE = 1e-4


class HFMambaCore(LibraryCore):
    """gradscope core over a transformers ``MambaModel``/``FalconMambaModel`` (held by reference)."""

    name = "hf-mamba"
    label = "Mamba (transformers)"
    library = "transformers"
    family = "Mamba"

    def __init__(self, backbone: nn.Module) -> None:
        cfg = backbone.config
        layers = backbone.layers
        mixer = layers[0].mixer
        self.I, self.N = int(mixer.intermediate_size), int(mixer.ssm_state_size)
        self.K, self.R = int(mixer.conv_kernel_size), int(mixer.time_step_rank)
        check(self.K >= 2, f"model: conv_kernel={self.K}; the adapter needs a causal conv of width >= 2")
        entries = []
        for i in range(len(layers)):
            entries += [Entry(f"l{i}/conv", (self.I, self.K - 1), "block_diagonal", self.K - 1),
                        Entry(f"l{i}/ssm", (self.I, self.N), "diagonal")]
        super().__init__(backbone, entries, int(cfg.hidden_size))
        self.num_layers = len(layers)
        self.falcon = hasattr(mixer, "b_layernorm")

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B = x.shape[0]
        parts = self.unpack(z)
        new, diag = {}, {}
        h = x
        for i, block in enumerate(self.model.layers):
            m = block.mixer
            hn = rms(h, block.norm.variance_epsilon) * block.norm.weight
            u, g = m.in_proj(hn).chunk(2, dim=-1)  # (B, I) each
            window = parts[f"l{i}/conv"]  # (B, I, K−1)
            full = torch.cat([window, u[..., None]], dim=-1)  # (B, I, K)
            c = (full * m.conv1d.weight[:, 0, :]).sum(-1)
            if m.conv1d.bias is not None:
                c = c + m.conv1d.bias
            c = m.act(c)
            dt, Bm, Cm = torch.split(m.x_proj(c), [self.R, self.N, self.N], dim=-1)
            if self.falcon:
                dt, Bm, Cm = rms(dt, m.dt_layernorm.eps), rms(Bm, m.b_layernorm.eps), rms(Cm, m.c_layernorm.eps)
            dt = F.softplus(m.dt_proj(dt))  # (B, I)
            dA = torch.exp(dt[..., None] * -torch.exp(m.A_log))  # (B, I, N)
            s = dA * parts[f"l{i}/ssm"] + (dt * c)[..., None] * Bm[:, None, :]
            out = (s * Cm[:, None, :]).sum(-1) + m.D * c
            h = h + m.out_proj(out * F.silu(g))
            new[f"l{i}/conv"] = full[..., 1:]
            new[f"l{i}/ssm"] = s
            if diagonal:
                diag[f"l{i}/conv"] = shift_blocks(B, self.I, self.K - 1, x)
                diag[f"l{i}/ssm"] = dA
        f = self.model.norm_f
        y = rms(h, f.variance_epsilon) * f.weight
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []


def adapt(model: nn.Module) -> Adapted:
    """The adapter of a ``MambaForCausalLM``/``MambaModel`` (or Falcon-Mamba)."""
    backbone = getattr(model, "backbone", model)
    check(hasattr(backbone, "layers") and hasattr(backbone, "norm_f"),
          f"model: {type(model).__name__} has no Mamba backbone (layers, norm_f)")
    return Adapted(HFMambaCore(backbone), TokenMap(backbone.embeddings), getattr(model, "lm_head", None),
                   hf_forward(model), TOLERANCE)


__all__ = ["HFMambaCore", "TOLERANCE", "adapt"]
