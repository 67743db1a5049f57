"""transformers' Mamba-2 (``Mamba2ForCausalLM``, ``Mamba2Model``: the SSD layer) as a gradscope core.

One step per layer l, as ``Mamba2Mixer``'s one-token path computes it, in the model's dtype (the
library rounds its scan to float32; the adapter does not)::

    g, xBC, Δ = in_proj(RMSNorm(h)) split (I, I + 2GN, H)   # h the residual stream
    c      = silu(Σ_k w_k · [window, xBC]_k + b)             # depthwise causal conv over K inputs
    x, B, C = c split (I, GN, GN)                            # x: H heads of P; B, C: G groups of N
    Δ      = clamp(softplus(Δ + dt_bias), time_step_limit)   # (B, H): one step size per head
    s'_h   = exp(Δ_h A_h) s_h + Δ_h x_h ⊗ B_g(h)             # (P, N) per head, A = −exp(A_log) (H,)
    y_h    = s'_h C_g(h) + D_h x_h
    h     += out_proj(GroupRMSNorm(y ⊙ silu(g)) ⊙ w)          # G groups of I/G
    window' = [window[1:], xBC]

State layout, layer 0 first: ``l<i>/conv`` (I + 2GN, K−1): the last K−1 conv inputs per channel,
oldest first (transformers caches K; the oldest is never read, so it is not part of z); ``l<i>/ssm``
(H, P, N): each head's matrix state. Structure: the conv window is a shift register (per channel a
nilpotent (K−1) × (K−1) block, exponents −∞); the SSM block is diagonal, one scalar exp(Δ_h A_h)
per head repeated over its P·N entries (so every head's exponent is E[Δ_h A_h] with multiplicity
P·N); layer l reads layers < l: block lower-triangular. The state is everything one step passes to the
next: per layer the convolution state and, per head, the P × N matrix state.

Output y_t: the backbone's last hidden state (``norm_f`` of the residual stream); readout: ``lm_head``
for ``Mamba2ForCausalLM`` (logits), none for ``Mamba2Model``.

Wrap-time check: outputs within :func:`~gradscope.models.adapters.base.agreement_tolerance` of the
library's full-sequence forward (its chunked scan runs in float32 even for a float64 model, and its
blocks add the residual in float32 when ``residual_in_fp32``; the adapter keeps the model's dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.base import Adapted, Entry, LibraryCore, TokenMap, hf_forward, rms, shift_blocks

TOLERANCE = 1e-4
SILU = ("silu", "swish")


class HFMamba2Core(LibraryCore):
    """gradscope core over a transformers ``Mamba2Model`` (held by reference)."""

    name = "hf-mamba2"
    label = "Mamba-2 (transformers)"
    library = "transformers"
    family = "Mamba-2"

    def __init__(self, backbone: nn.Module) -> None:
        cfg = backbone.config
        layers = backbone.layers
        m = layers[0].mixer
        self.I, self.N, self.K = int(m.intermediate_size), int(m.ssm_state_size), int(m.conv_kernel_size)
        self.H, self.P, self.G = int(m.num_heads), int(m.head_dim), int(m.n_groups)
        self.C = int(m.conv_dim)
        check(self.K >= 2, f"model: conv_kernel={self.K}; the adapter needs a causal conv of width >= 2")
        check(self.H * self.P == self.I and self.H % self.G == 0 and self.I % self.G == 0,
              f"model: {self.H} heads of {self.P} in {self.G} groups do not tile the inner width {self.I}")
        check(m.in_proj.out_features == self.I + self.C + self.H,
              f"model: in_proj gives {m.in_proj.out_features} features, not gate + conv + heads "
              f"({self.I + self.C + self.H}); this Mamba-2 variant is not one the adapter knows")
        check(str(getattr(cfg, "hidden_act", "silu")) in SILU,
              f"model: hidden_act={getattr(cfg, 'hidden_act', None)!r}; the adapter knows Mamba-2 with SiLU")
        entries = []
        for i in range(len(layers)):
            entries += [Entry(f"l{i}/conv", (self.C, self.K - 1), "block_diagonal", self.K - 1),
                        Entry(f"l{i}/ssm", (self.H, self.P, self.N), "diagonal", self.P * self.N)]  # a scalar a head
        super().__init__(backbone, entries, int(cfg.hidden_size))
        self.num_layers = len(layers)
        limit = tuple(float(v) for v in getattr(cfg, "time_step_limit", (0.0, float("inf"))))
        self.limit = None if limit == (0.0, float("inf")) else limit

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B = x.shape[0]
        parts = self.unpack(z)
        new, diag = {}, {}
        h = x
        rep = self.H // self.G
        for i, block in enumerate(self.model.layers):
            m = block.mixer
            hn = rms(h, block.norm.variance_epsilon) * block.norm.weight
            g, xbc, dt = torch.split(m.in_proj(hn), [self.I, self.C, self.H], dim=-1)
            full = torch.cat([parts[f"l{i}/conv"], xbc[..., None]], dim=-1)  # (B, C, K)
            c = (full * m.conv1d.weight[:, 0, :]).sum(-1)
            if m.conv1d.bias is not None:
                c = c + m.conv1d.bias
            c = F.silu(c)
            xs, Bm, Cm = torch.split(c, [self.I, self.G * self.N, self.G * self.N], dim=-1)
            dt = F.softplus(dt + m.dt_bias)  # (B, H)
            if self.limit is not None:
                dt = dt.clamp(self.limit[0], self.limit[1])
            dA = torch.exp(dt * -torch.exp(m.A_log))  # (B, H)
            xh = xs.reshape(B, self.H, self.P)
            Bh = Bm.reshape(B, self.G, 1, self.N).expand(B, self.G, rep, self.N).reshape(B, self.H, self.N)
            Ch = Cm.reshape(B, self.G, 1, self.N).expand(B, self.G, rep, self.N).reshape(B, self.H, self.N)
            s = dA[..., None, None] * parts[f"l{i}/ssm"] + (dt[..., None] * xh)[..., None] * Bh[:, :, None, :]
            y = (s * Ch[:, :, None, :]).sum(-1) + m.D[:, None] * xh  # (B, H, P)
            y = y.reshape(B, self.I) * F.silu(g)
            y = rms(y.reshape(B, self.G, self.I // self.G), m.norm.variance_epsilon).reshape(B, self.I) * m.norm.weight
            h = h + m.out_proj(y)
            new[f"l{i}/conv"] = full[..., 1:]
            new[f"l{i}/ssm"] = s
            if diagonal:
                diag[f"l{i}/conv"] = shift_blocks(B, self.C, self.K - 1, x)
                diag[f"l{i}/ssm"] = dA[..., None, None].expand(B, self.H, self.P, self.N)
        f = self.model.norm_f
        y = rms(h, f.variance_epsilon) * f.weight
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []


def adapt(model: nn.Module) -> Adapted:
    """The adapter of a ``Mamba2ForCausalLM``/``Mamba2Model``."""
    backbone = getattr(model, "backbone", model)
    check(hasattr(backbone, "layers") and hasattr(backbone, "norm_f"),
          f"model: {type(model).__name__} has no Mamba-2 backbone (layers, norm_f)")
    return Adapted(HFMamba2Core(backbone), TokenMap(backbone.embeddings), getattr(model, "lm_head", None),
                   hf_forward(model), TOLERANCE)


__all__ = ["HFMamba2Core", "TOLERANCE", "adapt"]
