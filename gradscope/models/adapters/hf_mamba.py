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
from gradscope.models.adapters.base import (Adapted, Entry, LibraryCore, adapt_backbone, conv_pre, conv_silu_jvp,
                                            conv_silu_vjp, linear_jvp, norm_linear_jvp, rms, rms_jvp, rms_vjp,
                                            shift_blocks, shift_window_jvp, silu_grad)
from gradscope.models.core import generic_step_cotangents, generic_step_tangents

TOLERANCE = 1e-4
SILU = ("silu", "swish")  # the activations step_tangents derives (transformers' names)


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


    def _silu(self) -> bool:
        """Whether every mixer's activation is SiLU (what the hand-derived products assume): the config
        says so and each mixer's ``act`` module is a SiLU (a replaced module goes the generic way)."""
        return getattr(self.model.config, "hidden_act", None) in SILU and all(
            isinstance(layer.mixer.act, nn.SiLU) or type(layer.mixer.act).__name__ == "SiLUActivation"
            for layer in self.model.layers)

    def step_tangents(self, x: Tensor, z: Tensor, dz: Tensor, t: int | None = None,
                      out: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One step and its forward-mode products, derived by hand (:func:`gradscope.models.core.step_tangents`'s
        shapes: dz (m, B, D)). The same equations as :meth:`advance`, differentiated: the primal runs once,
        the m tangents of the selective-scan state are updated in place (ds' = exp(ΔA) ds + dΔ·∂s'/∂Δ +
        d(Δc) B + Δc dB, with ∂s'/∂Δ = A exp(ΔA) s shared by the tangents), and each projection multiplies
        the primal and its tangents in one call. About 1.7× less CPU than ``vmap(jvp)`` of :meth:`advance`
        at mamba-130m's size (bench/realsize.py); the tests compare it with ``torch.func`` in float64.
        ``out``: buffers like (z, dz) to write z' and dz' into (a chain alternates two; they must not be
        z or dz). A mixer whose activation is not SiLU goes the generic way."""
        if not self._silu():
            return generic_step_tangents(self, x, z, dz, t)
        with torch.no_grad():  # products by hand: no graph of the parameters
            return self._step_tangents(x, z, dz, out)

    def _step_tangents(self, x: Tensor, z: Tensor, dz: Tensor,
                       out: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        B, m = x.shape[0], dz.shape[0]
        I, N, K = self.I, self.N, self.K
        z_out, dz_out = (torch.empty_like(z), torch.empty_like(dz)) if out is None else out
        h, dh = x, None  # the step's input has no tangent
        for i, block in enumerate(self.model.layers):
            mx = block.mixer
            sc, ss = self._slices[f"l{i}/conv"], self._slices[f"l{i}/ssm"]
            window, dwindow = z[:, sc].reshape(B, I, K - 1), dz[:, :, sc].reshape(m, B, I, K - 1)
            s_prev, ds_prev = z[:, ss].reshape(B, I, N), dz[:, :, ss].reshape(m, B, I, N)
            ug, dug = norm_linear_jvp(block.norm, mx.in_proj, h, dh)
            u, g = ug.chunk(2, dim=-1)
            du, dg = (None, None) if dug is None else dug.chunk(2, dim=-1)
            c, dc = conv_silu_jvp(mx.conv1d, window, dwindow, u, du)
            proj, dproj = linear_jvp(mx.x_proj, c, dc)
            dt, Bm, Cm = torch.split(proj, [self.R, N, N], dim=-1)
            ddt, dBm, dCm = torch.split(dproj, [self.R, N, N], dim=-1)
            if self.falcon:
                dt, ddt = rms_jvp(dt, ddt, mx.dt_layernorm.eps)
                Bm, dBm = rms_jvp(Bm, dBm, mx.b_layernorm.eps)
                Cm, dCm = rms_jvp(Cm, dCm, mx.c_layernorm.eps)
            dt_pre, ddt = linear_jvp(mx.dt_proj, dt, ddt)
            dt, ddt = F.softplus(dt_pre), ddt * torch.sigmoid(dt_pre)
            negA = -torch.exp(mx.A_log)  # (I, N)
            dA = torch.exp(dt[..., None] * negA)  # (B, I, N)
            dtc, ddtc = dt * c, ddt * c + dt * dc
            s = z_out[:, ss].view(B, I, N)
            torch.mul(dA, s_prev, out=s)
            s.addcmul_(dtc[..., None], Bm[:, None, :])
            ds = dz_out[:, :, ss].view(m, B, I, N)
            torch.mul(ds_prev, dA, out=ds)
            ds.addcmul_(ddt[..., None], dA * negA * s_prev)
            ds.addcmul_(ddtc[..., None], Bm[:, None, :])
            ds.addcmul_(dtc[..., None], dBm[:, :, None, :])
            out = (s @ Cm[..., None])[..., 0] + mx.D * c
            dout = (ds @ Cm[..., None])[..., 0] + (s @ dCm[..., None])[..., 0] + mx.D * dc
            gate = F.silu(g)
            dgated = dout * gate if dg is None else dout * gate + out * (dg * silu_grad(g))
            res, dres = linear_jvp(mx.out_proj, out * gate, dgated)
            h, dh = h + res, dres if dh is None else dh + dres
            shift_window_jvp(z_out[:, sc].view(B, I, K - 1), dz_out[:, :, sc].view(m, B, I, K - 1), window, dwindow, u, du)
        f = self.model.norm_f
        y, dy = rms_jvp(h, dh, f.variance_epsilon)
        return y * f.weight, z_out, dy * f.weight, dz_out


    def step_cotangents(self, x: Tensor, z: Tensor, gz: Tensor, t: int | None = None) -> Tensor:
        """gz · ∂z'/∂z for cotangent rows gz (r, B, D) on the new state: (r, B, D), derived by hand (the
        reverse of :meth:`step_tangents`; :func:`gradscope.models.core.step_cotangents`). One forward pass
        keeps each layer's intermediates, then the r rows go down the layers together: the residual
        stream's cotangent from the layers above, each layer's own state cotangent, the SSM's ∂s'/∂Δ
        shared by the rows. A mixer whose activation is not SiLU goes the generic way."""
        if not self._silu():
            return generic_step_cotangents(self, x, z, gz, t)
        with torch.no_grad():  # products by hand: no graph of the parameters
            return self._step_cotangents(x, z, gz)

    def _step_cotangents(self, x: Tensor, z: Tensor, gz: Tensor) -> Tensor:
        B, r = x.shape[0], gz.shape[0]
        I, N, K = self.I, self.N, self.K
        saved = []
        h = x
        for i, block in enumerate(self.model.layers):  # the forward pass, keeping what the reverse reads
            mx = block.mixer
            window = z[:, self._slices[f"l{i}/conv"]].reshape(B, I, K - 1)
            s_prev = z[:, self._slices[f"l{i}/ssm"]].reshape(B, I, N)
            hn = rms(h, block.norm.variance_epsilon) * block.norm.weight
            u, g = mx.in_proj(hn).chunk(2, dim=-1)
            pre = conv_pre(mx.conv1d, window, u)
            c = F.silu(pre)
            raw = torch.split(mx.x_proj(c), [self.R, N, N], dim=-1)
            dt, Bm, Cm = raw
            if self.falcon:
                dt, Bm, Cm = rms(dt, mx.dt_layernorm.eps), rms(Bm, mx.b_layernorm.eps), rms(Cm, mx.c_layernorm.eps)
            dt_pre = mx.dt_proj(dt)
            dt = F.softplus(dt_pre)
            negA = -torch.exp(mx.A_log)
            dA = torch.exp(dt[..., None] * negA)
            s = dA * s_prev
            s.addcmul_((dt * c)[..., None], Bm[:, None, :])
            out = (s @ Cm[..., None])[..., 0] + mx.D * c
            saved.append((h, g, pre, c, raw, Bm, Cm, dt_pre, dt, dA * negA * s_prev, dA, s, out))
            h = h + mx.out_proj(out * F.silu(g))
        gz_out = torch.empty_like(gz)
        g_h = None  # the top layer's output feeds only y, not z'
        for i in range(len(self.model.layers) - 1, -1, -1):
            block = self.model.layers[i]
            mx = block.mixer
            h, g, pre, c, raw, Bm, Cm, dt_pre, dt, Q, dA, s, out = saved[i]
            sc, ss = self._slices[f"l{i}/conv"], self._slices[f"l{i}/ssm"]
            g_s = gz[:, :, ss].reshape(r, B, I, N)
            g_win_new = gz[:, :, sc].reshape(r, B, I, K - 1)
            if g_h is None:
                g_gated = g_out = g_g = None
                g_total = g_s
            else:
                g_gated = F.linear(g_h, mx.out_proj.weight.t())  # (r, B, I)
                g_out = g_gated * F.silu(g)
                g_g = g_gated * out * silu_grad(g)
                g_total = g_s + g_out[..., None] * Cm[:, None, :]  # on s: from z' and from the output
            g_prev = gz_out[:, :, ss].view(r, B, I, N)
            torch.mul(g_total, dA, out=g_prev)
            dtc = dt * c
            g_dtc = (g_total @ Bm[..., None])[..., 0]  # (r, B, I)
            g_Bm = torch.einsum("rbin,bi->rbn", g_total, dtc)
            g_dt = (g_total * Q).sum(-1) + g_dtc * c
            g_c = g_dtc * dt
            if g_out is not None:
                g_c = g_c + g_out * mx.D
                g_Cm = torch.einsum("rbi,bin->rbn", g_out, s)
            else:
                g_Cm = torch.zeros_like(g_Bm)
            g_dtr = F.linear(g_dt * torch.sigmoid(dt_pre), mx.dt_proj.weight.t())
            if self.falcon:
                g_dtr = rms_vjp(raw[0], g_dtr, mx.dt_layernorm.eps)
                g_Bm = rms_vjp(raw[1], g_Bm, mx.b_layernorm.eps)
                g_Cm = rms_vjp(raw[2], g_Cm, mx.c_layernorm.eps)
            g_c = g_c + F.linear(torch.cat([g_dtr, g_Bm, g_Cm], dim=-1), mx.x_proj.weight.t())
            g_u = conv_silu_vjp(mx.conv1d, pre, g_c, g_win_new, gz_out[:, :, sc].view(r, B, I, K - 1))
            g_ug = torch.cat([g_u, g_g if g_g is not None else torch.zeros_like(g_u)], dim=-1)
            g_hn = F.linear(g_ug, mx.in_proj.weight.t()) * block.norm.weight
            g_in = rms_vjp(h, g_hn, block.norm.variance_epsilon)
            g_h = g_in if g_h is None else g_h + g_in
        return gz_out

def adapt(model: nn.Module) -> Adapted:
    """The adapter of a ``MambaForCausalLM``/``MambaModel`` (or Falcon-Mamba)."""
    return adapt_backbone(model, HFMambaCore, "Mamba", TOLERANCE)


__all__ = ["HFMambaCore", "TOLERANCE", "adapt"]
