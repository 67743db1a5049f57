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

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.base import (Adapted, Entry, LibraryCore, adapt_backbone, conv_silu_jvp, conv_silu_vjp,
                                            linear_jvp, rms, rms_jvp, rms_vjp, shift_blocks, shift_window_jvp,
                                            silu_grad)

TOLERANCE = 1e-4
SILU = ("silu", "swish")


class _Layer(NamedTuple):
    """One layer's step (:meth:`HFMamba2Core._layer`): the gate g, the conv input xBC and pre-activation,
    the heads' x, B and C, Δ and ∂Δ/∂raw, −A, the decay a = exp(ΔA), the new state s, the output y before
    and after its gate, and what the layer adds to the residual stream."""

    g: Tensor
    xbc: Tensor
    pre: Tensor
    xh: Tensor
    Bh: Tensor
    Ch: Tensor
    dt: Tensor
    slope: Tensor
    negA: Tensor
    a: Tensor
    s: Tensor
    y: Tensor
    yg: Tensor
    res: Tensor


class HFMamba2Core(LibraryCore):
    """gradscope core over a transformers ``Mamba2Model`` (held by reference)."""

    name = "hf-mamba2"
    label = "Mamba-2 (transformers)"
    library = "transformers"
    family = "Mamba-2"
    # Its own products against the generic price (gradscope.analysis.cost.products_seconds) at mamba2-130m's
    # size, this workplace's AMD EPYC, idle (2026-11-29). vjp: the flow's 16 cotangent rows, 0.234 s a step
    # on one thread where the generic price is 3.2 s. jvp: fitted to the whole stability sketch (its plan adds
    # a flops term for the same work): 96 and 768 sequences at 4 units took 140.6 s and 1,036.8 s with two
    # threads; this factor prices them at 132 s and 1,056 s (0.3 had said 198 s and 1,588 s). Mamba-1's
    # general factors (0.5, 0.3) price these 2–4× long: a head's state has no per-entry projections.
    own_cost = {"jvp": 0.15, "vjp": 0.074}

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

    def _layer(self, block: nn.Module, h: Tensor, window: Tensor, s_prev: Tensor) -> _Layer:
        """One layer's step from the residual stream h (B, hidden), its conv window (B, C, K−1) and matrix
        state (B, H, P, N): everything :meth:`advance` and the reverse pass read (module docstring)."""
        m, B = block.mixer, h.shape[0]
        hn = rms(h, block.norm.variance_epsilon) * block.norm.weight
        g, xbc, raw = torch.split(m.in_proj(hn), [self.I, self.C, self.H], dim=-1)
        pre = (torch.cat([window, xbc[..., None]], dim=-1) * m.conv1d.weight[:, 0, :]).sum(-1)  # (B, C)
        if m.conv1d.bias is not None:
            pre = pre + m.conv1d.bias
        xs, Bm, Cm = torch.split(F.silu(pre), [self.I, self.G * self.N, self.G * self.N], dim=-1)
        dt, slope = self._dt(m, raw)  # (B, H)
        negA = -torch.exp(m.A_log)
        a = torch.exp(dt * negA)  # (B, H): each head's one decay
        xh, Bh, Ch = xs.reshape(B, self.H, self.P), self._heads(Bm), self._heads(Cm)
        s = a[..., None, None] * s_prev + (dt[..., None] * xh)[..., None] * Bh[:, :, None, :]
        y = ((s * Ch[:, :, None, :]).sum(-1) + m.D[:, None] * xh).reshape(B, self.I)
        yg = y * F.silu(g)
        yn = rms(yg.reshape(B, self.G, self.I // self.G), m.norm.variance_epsilon).reshape(B, self.I)
        return _Layer(g, xbc, pre, xh, Bh, Ch, dt, slope, negA, a, s, y, yg, m.out_proj(yn * m.norm.weight))

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B = x.shape[0]
        parts = self.unpack(z)
        new, diag = {}, {}
        h = x
        for i, block in enumerate(self.model.layers):
            window = parts[f"l{i}/conv"]
            L = self._layer(block, h, window, parts[f"l{i}/ssm"])
            h = h + L.res
            new[f"l{i}/conv"] = torch.cat([window[..., 1:], L.xbc[..., None]], dim=-1)
            new[f"l{i}/ssm"] = L.s
            if diagonal:
                diag[f"l{i}/conv"] = shift_blocks(B, self.C, self.K - 1, x)
                diag[f"l{i}/ssm"] = L.a[..., None, None].expand(B, self.H, self.P, self.N)
        f = self.model.norm_f
        y = rms(h, f.variance_epsilon) * f.weight
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []

    def _dt(self, m: nn.Module, raw: Tensor) -> tuple[Tensor, Tensor]:
        """Δ = clamp(softplus(raw + dt_bias), limit) and ∂Δ/∂raw (zero where the clamp holds Δ)."""
        pre = raw + m.dt_bias
        dt, slope = F.softplus(pre), torch.sigmoid(pre)
        if self.limit is not None:
            inside = (dt >= self.limit[0]) & (dt <= self.limit[1])  # torch.clamp's own gradient rule
            dt, slope = dt.clamp(self.limit[0], self.limit[1]), slope * inside
        return dt, slope

    def _heads(self, v: Tensor) -> Tensor:
        """(…, G·N) group rows → (…, H, N): each head reads its group's row."""
        lead = v.shape[:-1]
        rep = self.H // self.G
        return v.reshape(*lead, self.G, 1, self.N).expand(*lead, self.G, rep, self.N).reshape(*lead, self.H, self.N)

    def step_tangents(self, x: Tensor, z: Tensor, dz: Tensor, t: int | None = None,
                      out: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One step and its forward-mode products, derived by hand (:func:`gradscope.models.core.step_tangents`'s
        shapes: dz (m, B, D)). The equations of :meth:`advance`, differentiated: the primal runs once, each
        projection multiplies the primal and its m tangents in one call, and each head's matrix state takes
        ds' = a ds + (A a dΔ) s + d(Δx) ⊗ B + Δx ⊗ dB, with a = exp(ΔA) one scalar a head. The tests compare
        it with ``torch.func`` in float64. ``out``: buffers like (z, dz) to write z' and dz' into (a chain
        alternates two; they must not be z or dz)."""
        with torch.no_grad():  # products by hand: no graph of the parameters
            return self._step_tangents(x, z, dz, out)

    def _step_tangents(self, x: Tensor, z: Tensor, dz: Tensor,
                       out: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        B, m = x.shape[0], dz.shape[0]
        I, C, K, H, P, N, G = self.I, self.C, self.K, self.H, self.P, self.N, self.G
        z_out, dz_out = (torch.empty_like(z), torch.empty_like(dz)) if out is None else out
        h, dh = x, None  # the step's input has no tangent
        for i, block in enumerate(self.model.layers):
            mx = block.mixer
            sc, ss = self._slices[f"l{i}/conv"], self._slices[f"l{i}/ssm"]
            window, dwindow = z[:, sc].reshape(B, C, K - 1), dz[:, :, sc].reshape(m, B, C, K - 1)
            s_prev, ds_prev = z[:, ss].reshape(B, H, P, N), dz[:, :, ss].reshape(m, B, H, P, N)
            if dh is None:
                hn, dhn = rms(h, block.norm.variance_epsilon) * block.norm.weight, None
            else:
                hn, dhn = rms_jvp(h, dh, block.norm.variance_epsilon)
                hn, dhn = hn * block.norm.weight, dhn * block.norm.weight
            proj, dproj = linear_jvp(mx.in_proj, hn, dhn)
            g, xbc, raw = torch.split(proj, [I, C, H], dim=-1)
            dg, dxbc, draw = (None, None, None) if dproj is None else torch.split(dproj, [I, C, H], dim=-1)
            c, dc = conv_silu_jvp(mx.conv1d, window, dwindow, xbc, dxbc)
            xs, Bm, Cm = torch.split(c, [I, G * N, G * N], dim=-1)
            dxs, dBm, dCm = torch.split(dc, [I, G * N, G * N], dim=-1)
            dt, slope = self._dt(mx, raw)
            ddt = None if draw is None else draw * slope  # (m, B, H)
            negA = -torch.exp(mx.A_log)  # (H,)
            a = torch.exp(dt * negA)  # (B, H)
            xh, dxh = xs.reshape(B, H, P), dxs.reshape(m, B, H, P)
            Bh, dBh, Ch = self._heads(Bm), self._heads(dBm), self._heads(Cm)
            u = dt[..., None] * xh  # (B, H, P): Δ x
            du = dt[..., None] * dxh if ddt is None else dt[..., None] * dxh + ddt[..., None] * xh
            s = z_out[:, ss].view(B, H, P, N)
            torch.mul(a[..., None, None], s_prev, out=s)
            s.addcmul_(u[..., None], Bh[:, :, None, :])  # broadcast products: no (m, B, H, P, N) temporaries
            ds = dz_out[:, :, ss].view(m, B, H, P, N)
            torch.mul(ds_prev, a[..., None, None], out=ds)
            if ddt is not None:
                ds.addcmul_((ddt * (negA * a))[..., None, None], s_prev)
            ds.addcmul_(du[..., None], Bh[:, :, None, :])
            ds.addcmul_(u[..., None], dBh[..., None, :])
            Cr = Ch[:, :, None, :]
            y = torch.linalg.vecdot(s, Cr) + mx.D[:, None] * xh  # (B, H, P)
            sdC = s.reshape(B, G, -1, N) @ dCm.reshape(m, B, G, N).permute(1, 2, 3, 0)  # a group's heads at once
            dy = torch.linalg.vecdot(ds, Cr) + sdC.reshape(B, H, P, m).permute(3, 0, 1, 2) + mx.D[:, None] * dxh
            gate = F.silu(g)
            y, dy = y.reshape(B, I), dy.reshape(m, B, I)
            yg = y * gate
            dyg = dy * gate if dg is None else dy * gate + y * (dg * silu_grad(g))
            yn, dyn = rms_jvp(yg.reshape(B, G, I // G), dyg.reshape(m, B, G, I // G), mx.norm.variance_epsilon)
            res, dres = linear_jvp(mx.out_proj, yn.reshape(B, I) * mx.norm.weight, dyn.reshape(m, B, I) * mx.norm.weight)
            h, dh = h + res, dres if dh is None else dh + dres
            shift_window_jvp(z_out[:, sc].view(B, C, K - 1), dz_out[:, :, sc].view(m, B, C, K - 1), window, dwindow,
                             xbc, dxbc)
        f = self.model.norm_f
        y, dy = rms_jvp(h, dh, f.variance_epsilon)
        return y * f.weight, z_out, dy * f.weight, dz_out

    def step_cotangents(self, x: Tensor, z: Tensor, gz: Tensor, t: int | None = None) -> Tensor:
        """gz · ∂z'/∂z for cotangent rows gz (r, B, D) on the new state: (r, B, D), derived by hand (the
        reverse of :meth:`step_tangents`; :func:`gradscope.models.core.step_cotangents`). One forward pass
        keeps each layer's intermediates, then the r rows go down the layers together: the residual
        stream's cotangent from the layers above and each layer's own state cotangent."""
        with torch.no_grad():  # products by hand: no graph of the parameters
            return self._step_cotangents(x, z, gz)

    def _step_cotangents(self, x: Tensor, z: Tensor, gz: Tensor) -> Tensor:
        B, r = x.shape[0], gz.shape[0]
        I, C, K, H, P, N, G = self.I, self.C, self.K, self.H, self.P, self.N, self.G
        saved = []
        h = x
        for i, block in enumerate(self.model.layers):  # the forward pass, keeping what the reverse reads
            s_prev = z[:, self._slices[f"l{i}/ssm"]].reshape(B, H, P, N)
            L = self._layer(block, h, z[:, self._slices[f"l{i}/conv"]].reshape(B, C, K - 1), s_prev)
            saved.append((h, s_prev, L))
            h = h + L.res
        gz_out = torch.empty_like(gz)
        g_h = None  # the top layer's output feeds only y, not z'
        for i in range(len(self.model.layers) - 1, -1, -1):
            block = self.model.layers[i]
            mx = block.mixer
            h, s_prev, (g, _, pre, xh, Bh, Ch, dt, slope, negA, a, s, y, yg, _) = saved[i]
            sc, ss = self._slices[f"l{i}/conv"], self._slices[f"l{i}/ssm"]
            g_s = gz[:, :, ss].reshape(r, B, H, P, N)
            g_win_new = gz[:, :, sc].reshape(r, B, C, K - 1)
            if g_h is None:
                g_y = g_g = None
                g_total = g_s  # read only
            else:
                g_yn = F.linear(g_h, mx.out_proj.weight.t()) * mx.norm.weight  # (r, B, I)
                g_yg = rms_vjp(yg.reshape(B, G, I // G), g_yn.reshape(r, B, G, I // G),
                                 mx.norm.variance_epsilon).reshape(r, B, I)
                g_y = (g_yg * F.silu(g)).reshape(r, B, H, P)
                g_g = g_yg * y * silu_grad(g)
                g_total = torch.addcmul(g_s, g_y[..., None], Ch[:, :, None, :])  # on s': from z' and the output
            # every product below is one pass over the (r, B, H, P, N) rows (no permuted copies)
            torch.mul(g_total, a[..., None, None], out=gz_out[:, :, ss].view(r, B, H, P, N))
            u = dt[..., None] * xh  # Δ x
            g_u = torch.linalg.vecdot(g_total, Bh[:, :, None, :])  # (r, B, H, P)
            g_Bm = (u.reshape(B, G, 1, -1) @ g_total.reshape(r, B, G, -1, N))[..., 0, :]  # (r, B, G, N): a group's heads
            g_dt = (negA * a) * torch.linalg.vecdot(g_total.flatten(-2), s_prev.flatten(-2)) + torch.linalg.vecdot(g_u, xh)
            g_xh = g_u * dt[..., None]
            if g_y is not None:
                g_xh = g_xh + g_y * mx.D[:, None]
                g_Cm = (g_y.reshape(r, B, G, -1).permute(1, 2, 0, 3) @ s.reshape(B, G, -1, N)).permute(2, 0, 1, 3)
            else:
                g_Cm = torch.zeros_like(g_Bm)
            g_c = torch.cat([g_xh.reshape(r, B, I), g_Bm.reshape(r, B, G * N), g_Cm.reshape(r, B, G * N)], dim=-1)
            g_xbc = conv_silu_vjp(mx.conv1d, pre, g_c, g_win_new, gz_out[:, :, sc].view(r, B, C, K - 1))
            g_proj = torch.cat([g_g if g_g is not None else g_xbc.new_zeros(r, B, I), g_xbc, g_dt * slope], dim=-1)
            g_hn = F.linear(g_proj, mx.in_proj.weight.t()) * block.norm.weight
            g_in = rms_vjp(h, g_hn, block.norm.variance_epsilon)
            g_h = g_in if g_h is None else g_h + g_in
        return gz_out


def adapt(model: nn.Module) -> Adapted:
    """The adapter of a ``Mamba2ForCausalLM``/``Mamba2Model``."""
    return adapt_backbone(model, HFMamba2Core, "Mamba-2", TOLERANCE)


__all__ = ["HFMamba2Core", "TOLERANCE", "adapt"]
