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

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.attention import CacheSlots
from gradscope.models.adapters.base import (Adapted, Entry, LibraryCore, adapt_backbone, conv_silu_jvp, conv_silu_vjp,
                                            linear_jvp, norm_linear_jvp, rms, rms_jvp, rms_vjp, shift_blocks,
                                            shift_window_jvp, silu_grad)

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
    # on one thread where the generic price is 3.2 s. jvp: one step's tangents (the step spectra's
    # estimators), fitted to whole stability sketches run step by step (96 and 768 sequences at 4 units:
    # 140.6 s and 1,036.8 s with two threads). chain: the sketch's tangent chain as chain_tangents runs it,
    # fitted to the same two runs (62.1 s and 369.1 s, load included): 0.457 s a sequence of 32 steps, of
    # which the plan's primal flops price 0.136 s and this factor the rest. Mamba-1's general factors (0.5,
    # 0.3) price these 2–4× long: a head's state has no per-entry projections. span: the flow's 16 rows
    # pulled back through 255 steps by span_cotangents, 32.3 s on one thread and 18.9 s on two, where the
    # generic price is 829 s.
    own_cost = {"jvp": 0.15, "vjp": 0.074, "chain": 0.062, "span": 0.036}

    def __init__(self, backbone: nn.Module) -> None:
        cfg = backbone.config
        layers = backbone.layers
        self._mixer_dims(layers[0].mixer, cfg)
        entries = []
        for i in range(len(layers)):
            entries += self._entries(i)
        super().__init__(backbone, entries, int(cfg.hidden_size))
        self.num_layers = len(layers)

    def _mixer_dims(self, m: nn.Module, cfg: object) -> None:
        """The SSD mixer's sizes (I, N, K, H, P, G, C) and the config's ``time_step_limit``, checked: every
        model with Mamba-2 mixers (Mamba-2, and the hybrids that reuse this step) reads them here."""
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
        limit = tuple(float(v) for v in getattr(cfg, "time_step_limit", (0.0, float("inf"))))
        self.limit = None if limit == (0.0, float("inf")) else limit

    def _entries(self, i: int) -> list[Entry]:
        """Layer i's state entries: its conv window and its heads' matrix states (a scalar decay a head)."""
        return [Entry(f"l{i}/conv", (self.C, self.K - 1), "block_diagonal", self.K - 1),
                Entry(f"l{i}/ssm", (self.H, self.P, self.N), "diagonal", self.P * self.N)]

    def _advance_layer(self, i: int, block: nn.Module, h: Tensor, parts: dict[str, Tensor], new: dict[str, Tensor],
                       diag: dict[str, Tensor] | None) -> Tensor:
        """Layer i's step (``block`` has ``norm`` and ``mixer``) on the residual stream h: its new state into
        ``new``, its diagonal blocks into ``diag`` (None: not asked); returns the new stream."""
        window = parts[f"l{i}/conv"]
        L = self._layer(block, h, window, parts[f"l{i}/ssm"])
        new[f"l{i}/conv"] = torch.cat([window[..., 1:], L.xbc[..., None]], dim=-1)
        new[f"l{i}/ssm"] = L.s
        if diag is not None:
            B = h.shape[0]
            diag[f"l{i}/conv"] = shift_blocks(B, self.C, self.K - 1, h)
            diag[f"l{i}/ssm"] = L.a[..., None, None].expand(B, self.H, self.P, self.N)
        return h + L.res

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
        parts = self.unpack(z)
        new: dict[str, Tensor] = {}
        diag: dict[str, Tensor] = {}
        h = x
        for i, block in enumerate(self.model.layers):
            h = self._advance_layer(i, block, h, parts, new, diag if diagonal else None)
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
            proj, dproj = norm_linear_jvp(block.norm, mx.in_proj, h, dh)
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

    def chain_tangents(self, x: Tensor, z: Tensor, dz: Tensor, t: int | None = None) -> tuple[Tensor, Tensor]:
        """The last output of steps over x (B, L, in) from z (B, D), and its forward-mode products for
        tangents dz (m, B, D) on z: (y_L (B, H), ∂y_L/∂z · dz (m, B, H))
        (:func:`gradscope.models.core.chain_tangents`).

        Equal to chaining :meth:`step_tangents` L times, but layer by layer over spans of up to
        :attr:`SPAN` steps in the SSD (dual) form: with ℓ_j = Δ_j A and α_j = exp(Σ_{ρ≤j} ℓ_ρ), a head's
        state is s_j = α_j s_0 + Σ_{σ≤j} (α_j/α_σ) u_σ ⊗ B_σ (u = Δ x), so its output s_j C_j and every
        tangent of it need s_0 and ds_0 only through the products s_0 C and ds_0 C over the span: one
        matrix product per layer reads the m tangent states once, where a chain of steps reads and writes
        them about nine times a step, and each projection multiplies the span's (1 + m)·B·L rows at once.
        The tangent of the decays is the tangent of the exponent: d(α_j/α_σ) = (α_j/α_σ)(dℓ-sums). The
        state and its tangent are formed only at a span's end. The tests compare it with chained
        :meth:`step_tangents` and with ``torch.func`` in float64."""
        with torch.no_grad():
            L = x.shape[1]
            for start in range(0, L, self.SPAN):
                last = start + self.SPAN >= L
                y, dy, z, dz = self._span(x[:, start:start + self.SPAN], z, dz, state=not last)
            return y, dy

    SPAN = 64  # steps a span: its (B, H, L, L) decay and Gram matrices stay small

    def _span(self, x: Tensor, z: Tensor, dz: Tensor, *, state: bool
              ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        B, L, m = x.shape[0], x.shape[1], dz.shape[0]
        I, C, K, H, P, N, G = self.I, self.C, self.K, self.H, self.P, self.N, self.G
        R = H // G  # heads a group
        z_out = torch.empty_like(z) if state else None
        dz_out = torch.empty_like(dz) if state else None
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).triu()  # [σ, j]: σ ≤ j
        later = causal.triu(1)  # [σ, ρ]: ρ > σ
        rows = dz.reshape(m * B, -1)  # the m·B tangent rows, one stride apart

        def per_group(v: Tensor) -> Tensor:  # (…, B, G, …) → (…, B, H, …): each head its group's
            lead = v.shape[:-4]
            return v.unsqueeze(-3).expand(*lead, B, G, R, *v.shape[-2:]).reshape(*lead, B, H, *v.shape[-2:])

        h, dh = x, None  # (B, L, hidden), (m, B, L, hidden): the span's inputs have no tangent
        for i, block in enumerate(self.model.layers):
            mx = block.mixer
            sc, ss = self._slices[f"l{i}/conv"], self._slices[f"l{i}/ssm"]
            window, dwindow = z[:, sc].reshape(B, C, K - 1), dz[:, :, sc].reshape(m, B, C, K - 1)
            s0 = z[:, ss].reshape(B, G, R * P, N)
            proj, dproj = norm_linear_jvp(block.norm, mx.in_proj, h, dh)
            g, xbc, raw = torch.split(proj, [I, C, H], dim=-1)  # (B, L, ·)
            dg, dxbc, draw = (None, None, None) if dproj is None else torch.split(dproj, [I, C, H], dim=-1)
            # the causal conv over [window, xBC_0 … xBC_{L−1}]: step j reads entries j … j+K−1
            w = mx.conv1d.weight[:, 0, :, None]  # (C, K, 1)
            seq = torch.cat([window, xbc.transpose(1, 2)], dim=-1)  # (B, C, K−1+L)
            dnew = dxbc.transpose(-1, -2) if dxbc is not None else dwindow.new_zeros(m, B, C, L)
            dseq = torch.cat([dwindow, dnew], dim=-1)
            pre = sum(seq[..., k:k + L] * w[:, k] for k in range(K))  # (B, C, L)
            if mx.conv1d.bias is not None:
                pre = pre + mx.conv1d.bias[:, None]
            dpre = sum(dseq[..., k:k + L] * w[:, k] for k in range(K))  # (m, B, C, L)
            c, dc = F.silu(pre).transpose(1, 2), (dpre * silu_grad(pre)).transpose(-1, -2)  # (·, B, L, C)
            xs, Bm, Cm = torch.split(c, [I, G * N, G * N], dim=-1)
            dxs, dBm, dCm = torch.split(dc, [I, G * N, G * N], dim=-1)
            dt, slope = self._dt(mx, raw)  # (B, L, H)
            negA = -torch.exp(mx.A_log)  # (H,)
            ell = (dt * negA).transpose(1, 2)  # (B, H, L): log a_j
            alpha = ell.cumsum(-1).exp()  # α_j
            # [σ, j] = α_j/α_σ = exp(Σ_{σ<ρ≤j} ℓ_ρ), each segment summed on its own (a difference of two long
            # cumulative sums would lose the short segments' digits in float32), 0 below the diagonal
            seg = ell[..., None, :].expand(*ell.shape, L).masked_fill(~later, 0.0)  # [σ, ρ] = ℓ_ρ for ρ > σ
            W = seg.cumsum(-1).masked_fill(~causal, -math.inf).exp()
            xh, dxh = xs.reshape(B, L, H, P), dxs.reshape(m, B, L, H, P)
            u = dt[..., None] * xh  # (B, L, H, P)
            du = dt[..., None] * dxh if draw is None else dt[..., None] * dxh + (draw * slope)[..., None] * xh
            Bg = Bm.reshape(B, L, G, N).transpose(1, 2)  # (B, G, L, N)
            dBg = dBm.reshape(m, B, L, G, N).transpose(-3, -2)
            Cg, dCg = Cm.reshape(B, L, G, N).permute(0, 2, 3, 1), dCm.reshape(m, B, L, G, N).permute(0, 1, 3, 4, 2)
            us, dus = u.permute(0, 2, 3, 1), du.permute(0, 1, 3, 4, 2)  # (·, B, H, P, L)
            Gm = per_group(Bg @ Cg)  # (B, H, L, L): [σ, j] = B_σ · C_j
            WG = W * Gm
            s0C = (s0 @ Cg).reshape(B, H, P, L)  # s_0 · C_j
            s0dC = (s0 @ dCg.permute(1, 2, 3, 0, 4).reshape(B, G, N, m * L)).reshape(B, H, P, m, L)
            s0dC = s0dC.permute(3, 0, 1, 2, 4)  # (m, B, H, P, L): s_0 · dC_j
            ds0C = torch.empty(m, B, H, P, L, dtype=x.dtype, device=x.device)  # ds_0 · C_j: one read of the tangents
            for q in range(G):
                heads = rows[:, ss].view(m * B, H, P, N)[:, q * R:(q + 1) * R].reshape(m * B, R * P, N)
                ds0C.view(m * B, H, P, L)[:, q * R:(q + 1) * R].copy_(
                    torch.bmm(heads, Cg[:, q].repeat(m, 1, 1)).view(m * B, R, P, L))
            y = alpha[..., None, :] * s0C + us @ WG  # (B, H, P, L): s_j · C_j
            dgap = 0.0
            if draw is not None:
                dcum = ((draw * slope) * negA).transpose(-1, -2).cumsum(-1)  # (m, B, H, L): the exponents' tangents
                dgap = dcum[..., None, :] - dcum[..., :, None]  # [σ, j]: dcum_j − dcum_σ
                dy = alpha[..., None, :] * (dcum[..., None, :] * s0C + ds0C + s0dC)
            else:
                dy = alpha[..., None, :] * (ds0C + s0dC)
            dWG = W * (dgap * Gm + per_group(dBg @ Cg + Bg @ dCg))  # (m, B, H, L, L)
            dy = dy + us @ dWG + dus @ WG
            y = y.permute(0, 3, 1, 2) + mx.D[:, None] * xh  # (B, L, H, P)
            dy = dy.permute(0, 1, 4, 2, 3) + mx.D[:, None] * dxh
            if state:  # the span's last state and its tangent: s_L = α s_0 + Σ_σ W[σ, L] u_σ ⊗ B_σ
                wl, a_end = W[..., None, :, -1], alpha[..., -1, None, None]  # (B, H, 1, L): [σ, L−1]; (B, H, 1, 1)
                s_end = z_out[:, ss].view(B, H, P, N)
                torch.mul(z[:, ss].view(B, H, P, N), a_end, out=s_end)
                s_end.add_(((us * wl).reshape(B, G, R * P, L) @ Bg).view(B, H, P, N))
                ds_end = dz_out[:, :, ss].view(m, B, H, P, N)
                torch.mul(dz[:, :, ss].view(m, B, H, P, N), a_end, out=ds_end)
                back = dus * wl
                if draw is not None:
                    ds_end.addcmul_(dcum[..., -1, None, None] * a_end, z[:, ss].view(B, H, P, N))
                    back = back + us * (wl * dgap[..., None, :, -1])
                ds_end.add_((back.reshape(m, B, G, R * P, L) @ Bg).view(m, B, H, P, N))
                ds_end.add_(((us * wl).reshape(B, G, R * P, L) @ dBg).view(m, B, H, P, N))
                z_out[:, sc].view(B, C, K - 1).copy_(seq[..., L:])
                dz_out[:, :, sc].view(m, B, C, K - 1).copy_(dseq[..., L:])
            gate = F.silu(g)
            y, dy = y.reshape(B, L, I), dy.reshape(m, B, L, I)
            yg = y * gate
            dyg = dy * gate if dg is None else dy * gate + y * (dg * silu_grad(g))
            yn, dyn = rms_jvp(yg.reshape(B, L, G, I // G), dyg.reshape(m, B, L, G, I // G), mx.norm.variance_epsilon)
            res, dres = linear_jvp(mx.out_proj, yn.reshape(B, L, I) * mx.norm.weight,
                                   dyn.reshape(m, B, L, I) * mx.norm.weight)
            h, dh = h + res, dres if dh is None else dh + dres
        f = self.model.norm_f
        y, dy = rms_jvp(h[:, -1], dh[:, :, -1], f.variance_epsilon)
        return y * f.weight, dy * f.weight, z_out, dz_out

    def span_cotangents(self, x: Tensor, z: Tensor, gz: Tensor, sumsq: Callable[[Tensor], Tensor],
                        t: int | None = None) -> tuple[Tensor, Tensor]:
        """Cotangent rows gz (r, B, D) on the state after the steps over x (B, L, in) from z (B, D), pulled
        back through all L steps: (the rows on z (r, B, D), sq (r, B, L) float64 with sq[..., k] =
        ‖the rows on the state before step k‖², k = 0 … L−1, by ``sumsq`` (Σ x² over the last axis in
        float64) summed over the layers) (:func:`gradscope.models.core.span_cotangents`; what the
        estimated flow needs of every step). Equal to :meth:`step_cotangents` chained L times, but layer by
        layer over the span: a layer's rows (r × H·P·N, laid out so that a sequence's group is one block)
        go back through its L steps while they stay in cache, each contraction with B, the state or x one
        matrix–vector product over the block; the projections multiply the span's r·B·L rows at once; the
        primal runs once for the span, layer by layer (each layer's states run again in the reverse)."""
        with torch.no_grad():
            return self._span_cotangents(x, z, gz, sumsq)

    def _span_cotangents(self, x: Tensor, z: Tensor, gz: Tensor,
                         sumsq: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
        B, L, r = x.shape[0], x.shape[1], gz.shape[0]
        I, C, K, H, P, N, G = self.I, self.C, self.K, self.H, self.P, self.N, self.G
        saved = []
        h = x
        for i, block in enumerate(self.model.layers):  # the primal over the span, layer by layer
            m = block.mixer
            s0 = z[:, self._slices[f"l{i}/ssm"]].reshape(B, H, P, N)
            window = z[:, self._slices[f"l{i}/conv"]].reshape(B, C, K - 1)
            hn = rms(h, block.norm.variance_epsilon) * block.norm.weight
            g, xbc, raw = torch.split(m.in_proj(hn), [I, C, H], dim=-1)  # (B, L, ·)
            w = m.conv1d.weight[:, 0, :, None]
            seq = torch.cat([window, xbc.transpose(1, 2)], dim=-1)  # (B, C, K−1+L)
            pre = sum(seq[..., k:k + L] * w[:, k] for k in range(K))
            if m.conv1d.bias is not None:
                pre = pre + m.conv1d.bias[:, None]
            pre = pre.transpose(1, 2)  # (B, L, C)
            xs, Bm, Cm = torch.split(F.silu(pre), [I, G * N, G * N], dim=-1)
            dt, slope = self._dt(m, raw)  # (B, L, H)
            negA = -torch.exp(m.A_log)
            a = torch.exp(dt * negA)
            xh = xs.reshape(B, L, H, P)
            # time-major copies (L, B, …): each step's slice is contiguous, which torch's broadcast products need
            # to run at speed (a strided slice of (B, L, …) ran them ~15× slower)
            aT, dtT, xT = (v.transpose(0, 1).contiguous() for v in (a, dt, xh))
            BT, CT = self._heads(Bm.transpose(0, 1).contiguous()), self._heads(Cm.transpose(0, 1).contiguous())
            uT = dtT[..., None] * xT  # (L, B, H, P): Δ x
            yT = torch.empty(L, B, H, P, dtype=x.dtype, device=x.device)
            s = s0
            for j in range(L):
                s = torch.mul(s, aT[j][..., None, None])
                s.addcmul_(uT[j][..., None], BT[j][:, :, None, :])
                yT[j] = torch.linalg.vecdot(s, CT[j][:, :, None, :])
            y = (yT.transpose(0, 1) + m.D[:, None] * xh).reshape(B, L, I)
            yg = y * F.silu(g)
            yn = rms(yg.reshape(B, L, G, I // G), m.norm.variance_epsilon).reshape(B, L, I)
            saved.append((h, s0, g, pre, xT, BT, CT, dtT, slope, negA, aT, uT, y, yg))
            h = h + m.out_proj(yn * m.norm.weight)
        g_out = torch.empty_like(gz)
        sq = torch.zeros(r, B, L, dtype=torch.float64, device=x.device)
        states = torch.empty(L, B, H, P, N, dtype=x.dtype, device=x.device)
        g_h = None  # the top layer's output feeds only y, not z'
        for i in range(len(self.model.layers) - 1, -1, -1):
            block = self.model.layers[i]
            mx = block.mixer
            h, s0, g, pre, xT, BT, CT, dtT, slope, negA, aT, uT, y, yg = saved[i]
            sc, ss = self._slices[f"l{i}/conv"], self._slices[f"l{i}/ssm"]
            s = s0
            for j in range(L):  # the layer's states again (one layer's: L × B·H·P·N)
                s = torch.mul(aT[j][..., None, None], s, out=states[j])
                s.addcmul_(uT[j][..., None], BT[j][:, :, None, :])
            if g_h is None:
                g_y = g_g = None
            else:
                g_yn = F.linear(g_h, mx.out_proj.weight.t()) * mx.norm.weight  # (r, B, L, I)
                g_yg = rms_vjp(yg.reshape(B, L, G, I // G), g_yn.reshape(r, B, L, G, I // G),
                               mx.norm.variance_epsilon).reshape(r, B, L, I)
                g_y = (g_yg * F.silu(g)).reshape(r, B, L, G, H // G, P).permute(2, 1, 3, 0, 4, 5).contiguous()
                g_g = g_yg * y * silu_grad(g)  # g_y: (L, B, G, r, R, P), a step's slice laid out as the rows below
            # the rows on the layer's state, carried back, laid out (B, G, r, R·P, N): a sequence's group is one
            # block, so each contraction below is a matrix–vector product over it
            Rh = H // G
            gs = gz[:, :, ss].reshape(r, B, G, Rh * P, N).permute(1, 2, 0, 3, 4).contiguous()
            heads = gs.view(B, G, r, Rh, P, N)
            g_win = gz[:, :, sc].reshape(r, B, C, K - 1)
            g_dt = torch.empty(r, B, L, H, dtype=x.dtype, device=x.device)
            g_xbc = torch.empty(r, B, L, C, dtype=x.dtype, device=x.device)
            g_u = torch.empty(r, B, G, Rh * P, dtype=x.dtype, device=x.device)
            g_ss = torch.empty(r, B, H, dtype=x.dtype, device=x.device)  # ⟨rows, s_{j−1}⟩ a head
            g_Bm = torch.empty(r, B, G, N, dtype=x.dtype, device=x.device)
            g_Cm = torch.zeros(r, B, G, N, dtype=x.dtype, device=x.device)
            g_c = torch.empty(r, B, C, dtype=x.dtype, device=x.device)  # on the conv's output: x, B, C
            Bj_all, uj_all = BT.view(L, B, G, Rh, N)[:, :, :, 0], uT.reshape(L, B, G, Rh * P)
            for j in range(L - 1, -1, -1):
                s_prev = (states[j - 1] if j else s0).view(B, G, Rh, P * N)
                if g_y is not None:  # on s_j: from the later steps and from its own output
                    heads.addcmul_(g_y[j][..., None], CT[j].view(B, G, 1, Rh, 1, N))
                for b in range(B):
                    for q in range(G):
                        blk = gs[b, q]  # (r, R·P, N)
                        g_u[:, b, q] = torch.mv(blk.view(-1, N), Bj_all[j, b, q]).view(r, -1)
                        g_Bm[:, b, q] = torch.bmm(uj_all[j, b, q].view(1, 1, -1).expand(r, 1, -1), blk)[:, 0]
                        g_ss[:, b, q * Rh:(q + 1) * Rh] = torch.bmm(  # a head's rows against its s_{j−1}
                            s_prev[b, q].view(Rh, 1, P * N), blk.view(r, Rh, P * N).permute(1, 2, 0))[:, 0].t()
                        if g_y is not None:
                            g_Cm[:, b, q] = g_y[j, b, q].reshape(r, Rh * P) @ states[j][b].view(G, Rh * P, N)[q]
                gu = g_u.view(r, B, H, P)
                g_dt[:, :, j] = (negA * aT[j]) * g_ss + torch.linalg.vecdot(gu, xT[j])
                g_xh = gu * dtT[j][..., None]
                if g_y is not None:
                    g_xh = g_xh + g_y[j].permute(2, 0, 1, 3, 4).reshape(r, B, H, P) * mx.D[:, None]
                g_c[..., :I] = g_xh.reshape(r, B, I)
                g_c[..., I:I + G * N], g_c[..., I + G * N:] = g_Bm.view(r, B, -1), g_Cm.view(r, B, -1)
                g_prev_win = torch.empty_like(g_win)
                g_xbc[:, :, j] = conv_silu_vjp(mx.conv1d, pre[:, j], g_c, g_win, g_prev_win)
                g_win = g_prev_win
                heads.mul_(aT[j].view(B, G, 1, Rh, 1, 1))  # on s_{j−1}: the state before step j
                sq[..., j] += sumsq(gs.view(B, G, r, -1)).sum(1).t() + sumsq(g_win.reshape(r, B, -1))
            g_out[:, :, ss] = gs.permute(2, 0, 1, 3, 4).reshape(r, B, -1)
            g_out[:, :, sc] = g_win.reshape(r, B, -1)
            g_proj = torch.cat([g_g if g_g is not None else g_xbc.new_zeros(r, B, L, I), g_xbc,
                                g_dt * slope], dim=-1)
            g_hn = F.linear(g_proj, mx.in_proj.weight.t()) * block.norm.weight
            g_in = rms_vjp(h, g_hn, block.norm.variance_epsilon)
            g_h = g_in if g_h is None else g_h + g_in
        return g_out, sq

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



class Mamba2HybridCore(CacheSlots, HFMamba2Core):
    """The base of a hybrid whose recurrent layers are Mamba-2 (Bamba, Nemotron-H, Falcon-H1, Zamba2): its attention
    caches are state (:mod:`~gradscope.models.adapters.attention`), the step reads its position, and its Jacobian
    products are ``torch.func``'s (the hand-derived ones above walk every layer as Mamba-2)."""

    position_dependent = True
    own_cost: dict[str, float] = {}
    step_tangents = step_cotangents = chain_tangents = span_cotangents = None  # type: ignore[assignment]


def adapt(model: nn.Module) -> Adapted:
    """The adapter of a ``Mamba2ForCausalLM``/``Mamba2Model``."""
    return adapt_backbone(model, HFMamba2Core, "Mamba-2", TOLERANCE)


__all__ = ["HFMamba2Core", "TOLERANCE", "adapt"]
