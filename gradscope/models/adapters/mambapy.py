"""mambapy's pure-PyTorch Mamba (``mambapy.mamba.Mamba``, and ``mambapy.lm.LM`` around it) as a gradscope core.

This adapter runs mambapy's own recurrent ``Mamba.step(x, caches)`` (one token per call, the code
``LM.generate`` uses); it only converts between gradscope's flat real state z and mambapy's
per-layer caches ``(h (B, ED, N), inputs (B, ED, d_conv − 1))``. mambapy's step builds new tensors
(no in-place cache writes), so torch.func transforms it as it is.

State layout, layer 0 first: ``l<i>/conv`` (ED, d_conv − 1): the layer's last d_conv − 1 conv inputs
(the in_proj x-branch before the conv), oldest first; ``l<i>/ssm`` (ED, N): the selective-SSM state h.
Every entry is read. Structure: the conv window is a shift register (per channel a nilpotent
(d_conv − 1)-square block, exponents −∞), the SSM block is diagonal exp(Δ A); block lower-triangular
across entries and layers. The state starts at zero, as in mambapy.

Output y_t: the Mamba stack's output (the residual stream after the last layer; ``Mamba`` has no final
norm). For an ``LM`` the readout is its ``norm_f`` and ``lm_head`` (logits). No ``readout(x, z)``:
y_t reads d_conv inputs but the cache after step t keeps d_conv − 1, so Jacobians need p < T.

Wrap-time check: outputs within 1e-5 of mambapy's own parallel-scan forward, relative to their largest
magnitude (at least 1); both run the same float32-rounded A and D (mambapy casts them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.base import Adapted, Entry, LibraryCore, TokenMap, shift_blocks

TOLERANCE = 1e-5
# mambapy 1.2's Mamba-2 builds its gated norm and runs its scan only through mamba_ssm's Triton kernels (a
# GPU), and its blocks have no one-token step: there is nothing to adapt on a CPU
MAMBA2_NOTE = ("; mambapy's Mamba-2 runs only through mamba_ssm's GPU kernels and has no one-token step: wrap "
               "transformers' Mamba2ForCausalLM instead")


class MambapyCore(LibraryCore):
    """gradscope core over a ``mambapy.mamba.Mamba`` (held by reference, run by its own ``step``)."""

    name = "mambapy"
    label = "Mamba (mambapy)"
    library = "mambapy"
    family = "Mamba"

    def __init__(self, mamba: nn.Module) -> None:
        cfg = mamba.config
        self.d_inner, self.d_state, self.d_window = int(cfg.d_inner), int(cfg.d_state), int(cfg.d_conv) - 1
        check(self.d_window >= 1, f"model: d_conv={cfg.d_conv}; the adapter needs a causal conv of width >= 2")
        entries = []
        for i in range(int(cfg.n_layers)):
            entries += [Entry(f"l{i}/conv", (self.d_inner, self.d_window), "block_diagonal", self.d_window),
                        Entry(f"l{i}/ssm", (self.d_inner, self.d_state), "diagonal")]
        super().__init__(mamba, entries, int(cfg.d_model))
        self.num_layers = int(cfg.n_layers)

    @property
    def mamba(self) -> nn.Module:
        return self.model

    def to_caches(self, z: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Flat z (B, D) → mambapy's caches [(h (B, ED, N), inputs (B, ED, d_conv − 1)) per layer]."""
        parts = self.unpack(z)
        return [(parts[f"l{i}/ssm"], parts[f"l{i}/conv"]) for i in range(self.num_layers)]

    def from_caches(self, caches: list[tuple[Tensor, Tensor]]) -> Tensor:
        """mambapy's caches → flat z (B, D) (the inverse of :meth:`to_caches`)."""
        return self.pack({k: v for i, (h, window) in enumerate(caches) for k, v in ((f"l{i}/ssm", h),
                                                                                      (f"l{i}/conv", window))})

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        caches = self.to_caches(z)
        diag = self._diagonals(x, caches) if diagonal else []
        y, caches = self.model.step(x, list(caches))  # mambapy overwrites the list's entries: a fresh list
        return y, self.from_caches(caches), diag

    def _diagonals(self, x: Tensor, caches: list[tuple[Tensor, Tensor]]) -> list[Tensor]:
        """exp(Δ A) of every layer, recomputed through mambapy's own modules (Δ is internal to its step)."""
        out: list[Tensor] = []
        h = x
        for layer, cache in zip(self.model.layers, caches):
            m = layer.mixer
            xb = m.in_proj(layer.norm(h)).chunk(2, dim=1)[0]
            c = F.silu(m.conv1d(torch.cat([cache[1], xb[..., None]], dim=2))[:, :, self.d_window])
            delta, Bm, Cm = torch.split(m.x_proj(c), [m.config.dt_rank, self.d_state, self.d_state], dim=-1)
            delta = F.softplus(m.dt_proj(m._apply_layernorms(delta, Bm, Cm)[0]))
            dA = torch.exp(delta[..., None] * -torch.exp(m.A_log.float()))  # (B, ED, N), as mambapy rounds A
            out += [shift_blocks(x.shape[0], self.d_inner, self.d_window, x), dA.reshape(x.shape[0], -1).to(x.dtype)]
            h = layer.step(h, cache)[0]
        return out


class LMHead(nn.Module):
    """mambapy ``LM``'s readout: its ``norm_f`` then ``lm_head`` (held by reference)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.norm_f, self.lm_head = lm.norm_f, lm.lm_head

    def forward(self, y: Tensor) -> Tensor:
        return self.lm_head(self.norm_f(y))


def adapt(model: nn.Module) -> Adapted:
    """The adapter of a mambapy ``Mamba`` (float inputs (B, T, d_model), no readout) or ``LM`` (token ids → logits)."""
    if hasattr(model, "mamba") and hasattr(model, "lm_head"):  # mambapy.lm.LM
        check(not getattr(model.config, "mup", False), "model: a mambapy LM with mup=True is not supported")
        check(type(model.mamba).__name__ == "Mamba", f"model: the LM's backbone is {type(model.mamba).__name__}; "
                                                     f"the adapter knows mambapy's Mamba" + MAMBA2_NOTE)
        return Adapted(MambapyCore(model.mamba), TokenMap(model.embedding), LMHead(model), model, TOLERANCE)
    check(type(model).__name__ == "Mamba", f"model: {type(model).__name__} is not mambapy's Mamba" + MAMBA2_NOTE)
    return Adapted(MambapyCore(model), None, None, model, TOLERANCE)


__all__ = ["LMHead", "MambapyCore", "TOLERANCE", "adapt"]
