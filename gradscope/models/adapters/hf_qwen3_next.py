"""transformers' Qwen3-Next (``Qwen3NextForCausalLM``, ``Qwen3NextModel``): Gated DeltaNet layers and gated
attention layers, with dense or mixture-of-experts MLPs, as a gradscope core.

One step per decoder layer, as the library's one-token paths compute it, in the model's dtype (the library
runs its delta rule, RMSNorms and router in float32; the adapter does not)::

    ĥ = RMSNorm(h)                                   # x / rms(x) · (1 + w)
    linear attention (Gated DeltaNet), per value head (H_v heads of d_v; key heads H_k of d_k, shared by
    H_v/H_k value heads):
        q, k, v, zg = in_proj_qkvz(ĥ);  b, a = in_proj_ba(ĥ)
        q, k, v = silu(causal conv over [window, (q, k, v)])          # depthwise, K taps, no bias
        q, k = l2norm(q), l2norm(k);  q /= sqrt(d_k)
        β = σ(b);  α = exp(−exp(A_log) · softplus(a + dt_bias))
        S' = α (I − β k kᵀ) S + β k vᵀ                                  # S (d_k, d_v): the gated delta rule
        o = S'ᵀ q;  out = out_proj(RMSNormGated(o, zg))                 # w · o / rms(o) · silu(zg), per head
    full attention (gated): q, gate = q_proj(ĥ);  q, k = RMSNorm(q), RMSNorm(k_proj ĥ);  v = v_proj ĥ;
        q, k = rope(q, k, t);  slot t of the cache ← (k, v);  o = softmax(q Kᵀ/√d) V over slots ≤ t;
        out = o_proj(o ⊙ σ(gate))
    h += out;  h += MLP(RMSNorm(h))                  # SwiGLU, or the sparse MoE (top-k experts + shared)

State layout, layer 0 first: a linear-attention layer has ``l<i>/conv`` (C, K−1), the last K−1 conv inputs
per channel, oldest first (C = 2 H_k d_k + H_v d_v), and ``l<i>/delta`` (H_v, d_v, d_k): each head's S
**transposed**, so that the step on it, M_t ⊗ I over S's d_v columns with M_t = α(I − β k kᵀ), is d_v
consecutive copies of the d_k × d_k block M_t (block_diagonal, size d_k, repeat d_v; one declared block a
head, ``l<i>/delta/h<j>``): a head's exponents are M's cocycle's d_k, each with multiplicity d_v. A full-attention layer has ``l<i>/keys`` and
``l<i>/values`` (positions, H_kv, d): its KV cache (:mod:`~gradscope.models.adapters.attention`), held by
the spectra. The step is position-dependent (rotary embedding, cache slot).

Output y_t: the backbone's last hidden state (``norm`` of the residual stream); readout: ``lm_head`` for
``Qwen3NextForCausalLM`` (logits), none for ``Qwen3NextModel``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.attention import (POSITIONS, CacheSlots, attention_step, cache_entries, check_position,
                                                 check_positions, cache_diagonal, rope, rotary, rotate_half)
from gradscope.models.adapters.base import (Adapted, Entry, LibraryCore, TokenMap, conv_silu_jvp, hf_forward, linear_jvp,
                                            rms, rms_jvp, shift_blocks, shift_window_jvp, silu_grad)
from gradscope.models.structure import JacobianStructure

TOLERANCE = 1e-4
L2_EPS = 1e-6  # the library's l2norm on q and k (as FLA's)


def norm1p(module: nn.Module, x: Tensor) -> Tensor:
    """Qwen3-Next's RMSNorm in x's dtype: x / rms(x) · (1 + weight)."""
    return rms(x, module.eps) * (1.0 + module.weight)


def l2norm(x: Tensor) -> Tensor:
    """x / sqrt(Σ x² + 1e-6) over the last axis."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def swiglu(mlp: nn.Module, x: Tensor) -> Tensor:
    """A gate/up/down MLP: down(act(gate x) ⊙ up x)."""
    return mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))


def sparse_moe(moe: nn.Module, x: Tensor) -> Tensor:
    """The sparse MoE block of one token per sequence, x (B, hidden), functionally: the router's top-k
    experts (probabilities renormalised over the k when ``norm_topk_prob``), each expert's SwiGLU read by
    gathering its weights per token (no data-dependent loop, so torch.func transforms it), plus the shared
    expert times σ(shared gate). The routing is piecewise constant: its derivative is that of the chosen
    experts' weights and outputs."""
    router, experts = moe.gate, moe.experts
    probs = torch.softmax(F.linear(x, router.weight), dim=-1)
    top, index = torch.topk(probs, router.top_k, dim=-1)  # (B, k)
    if router.norm_topk_prob:
        top = top / top.sum(-1, keepdim=True)
    gate_up = experts.gate_up_proj[index]  # (B, k, 2I, hidden)
    gate, up = torch.einsum("bkoh,bh->bko", gate_up, x).chunk(2, dim=-1)
    act = experts.act_fn(gate) * up  # (B, k, I)
    out = torch.einsum("bkhi,bki->bkh", experts.down_proj[index], act)  # (B, k, hidden)
    shared = swiglu(moe.shared_expert, x) * torch.sigmoid(moe.shared_expert_gate(x))
    return (out * top[..., None]).sum(1) + shared


def mlp_step(mlp: nn.Module, x: Tensor) -> Tensor:
    """A decoder layer's MLP on x (B, hidden): the sparse MoE where the layer has one, else the SwiGLU."""
    return sparse_moe(mlp, x) if hasattr(mlp, "experts") else swiglu(mlp, x)


def norm1p_jvp(module: nn.Module, x: Tensor, dx: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """:func:`norm1p` and its tangents for dx (m, …) or None."""
    if dx is None:
        return norm1p(module, x), None
    y, dy = rms_jvp(x, dx, module.eps)
    return y * (1.0 + module.weight), dy * (1.0 + module.weight)


def l2norm_jvp(x: Tensor, dx: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """:func:`l2norm` and its tangents: with r = (Σx² + ε)^−½, d(x r) = r dx − x r³ (x · dx)."""
    r = torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)
    y = x * r
    return y, None if dx is None else dx * r - y * (r * r * (x * dx).sum(-1, keepdim=True))


def _add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    return b if a is None else a if b is None else a + b


def swiglu_jvp(mlp: nn.Module, x: Tensor, dx: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """:func:`swiglu` and its tangents (SiLU activation)."""
    gate, dgate = linear_jvp(mlp.gate_proj, x, dx)
    up, dup = linear_jvp(mlp.up_proj, x, dx)
    act = F.silu(gate)
    da = None if dx is None else silu_grad(gate) * dgate * up + act * dup
    return linear_jvp(mlp.down_proj, act * up, da)


def sparse_moe_jvp(moe: nn.Module, x: Tensor, dx: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """:func:`sparse_moe` and its tangents: the chosen experts fixed (the routing is piecewise constant), their
    renormalised probabilities and outputs differentiated."""
    if dx is None:
        return sparse_moe(moe, x), None
    router, experts = moe.gate, moe.experts
    logits, dlogits = linear_jvp(router, x, dx) if isinstance(router, nn.Linear) else \
        (F.linear(x, router.weight), F.linear(dx, router.weight))
    probs = torch.softmax(logits, dim=-1)
    dprobs = probs * (dlogits - (probs * dlogits).sum(-1, keepdim=True))
    top, index = torch.topk(probs, router.top_k, dim=-1)  # (B, k)
    dtop = dprobs.gather(-1, index.expand(dx.shape[0], *index.shape))
    if router.norm_topk_prob:
        total = top.sum(-1, keepdim=True)
        dtop = dtop / total - top * dtop.sum(-1, keepdim=True) / total ** 2
        top = top / total
    gate_up, down = experts.gate_up_proj[index], experts.down_proj[index]  # (B, k, 2I, hidden), (B, k, hidden, I)
    gate, up = torch.einsum("bkoh,bh->bko", gate_up, x).chunk(2, dim=-1)
    dgate, dup = torch.einsum("bkoh,mbh->mbko", gate_up, dx).chunk(2, dim=-1)
    act = experts.act_fn(gate)
    a, da = act * up, silu_grad(gate) * dgate * up + act * dup
    out = torch.einsum("bkhi,bki->bkh", down, a)
    dout = torch.einsum("bkhi,mbki->mbkh", down, da)
    shared, dshared = swiglu_jvp(moe.shared_expert, x, dx)
    sg_pre, dsg_pre = linear_jvp(moe.shared_expert_gate, x, dx)
    sg = torch.sigmoid(sg_pre)
    dsg = sg * (1 - sg) * dsg_pre
    y = (out * top[..., None]).sum(1) + shared * sg
    dy = (dout * top[..., None]).sum(-2) + (out * dtop[..., None]).sum(-2) + dshared * sg + shared * dsg
    return y, dy


def mlp_jvp(mlp: nn.Module, x: Tensor, dx: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """:func:`mlp_step` and its tangents."""
    return sparse_moe_jvp(mlp, x, dx) if hasattr(mlp, "experts") else swiglu_jvp(mlp, x, dx)


class HFQwen3NextCore(CacheSlots, LibraryCore):
    """gradscope core over a transformers ``Qwen3NextModel`` (held by reference)."""

    name = "hf-qwen3-next"
    label = "Qwen3-Next (transformers)"
    library = "transformers"
    family = "Qwen3-Next"
    position_dependent = True
    # The sketch's tangent chain as chain_tangents runs it, against the plan's generic price of the whole chain
    # (flops and products), fitted to whole stability runs of the 124.9M-parameter hybrid of
    # bench/stability_realsize.py (qwen3next-125m; 768 sequences of 32 steps, two threads, this workplace's AMD
    # EPYC, idle, 2026-11-29): 4 units 435.6 s and 6 units 655.9 s wall, each ~15.7 s of it loading (which the
    # plan never prices); 0.335 and 0.370 fit them one at a time, and the larger is kept so that the plan's
    # choice of units errs short of the budget (the generic price, 0.5 a product, said 735 s for 4 units).
    own_cost = {"chain": 0.37}

    def __init__(self, backbone: nn.Module, positions: int = POSITIONS) -> None:
        cfg = backbone.config
        check(str(cfg.hidden_act) in ("silu", "swish"), f"model: hidden_act={cfg.hidden_act!r}; the adapter knows "
                                                        f"Qwen3-Next with SiLU")
        self.types = tuple(cfg.layer_types[:cfg.num_hidden_layers])
        unknown = sorted(set(self.types) - {"linear_attention", "full_attention"})
        check(not unknown, f"model: layer types {unknown} are not ones the Qwen3-Next adapter knows")
        self.Hv, self.Hk = int(cfg.linear_num_value_heads), int(cfg.linear_num_key_heads)
        self.dk, self.dv, self.K = int(cfg.linear_key_head_dim), int(cfg.linear_value_head_dim), int(cfg.linear_conv_kernel_dim)
        check(self.Hv % self.Hk == 0, f"model: {self.Hv} value heads do not share {self.Hk} key heads evenly")
        check(self.K >= 2, f"model: linear_conv_kernel_dim={self.K}; the adapter needs a causal conv of width >= 2")
        self.C = 2 * self.Hk * self.dk + self.Hv * self.dv
        self.Hq, self.Hkv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.Hq)
        self.positions = check_positions(positions)
        entries = []
        for i, kind in enumerate(self.types):
            if kind == "linear_attention":
                entries += [Entry(f"l{i}/conv", (self.C, self.K - 1), "block_diagonal", self.K - 1),
                            Entry(f"l{i}/delta", (self.Hv, self.dv, self.dk), "block_diagonal", self.dk, self.dv)]
            else:
                entries += cache_entries(i, self.positions, self.Hkv, self.hd)
        super().__init__(backbone, entries, int(cfg.hidden_size))
        self.num_layers = len(self.types)


    def _delta(self, layer: nn.Module, hn: Tensor, window: Tensor, St: Tensor, blocks: bool
               ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """One Gated DeltaNet step from the normed stream hn (B, hidden), the conv window (B, C, K−1) and the
        transposed states St (B, H_v, d_v, d_k) → (what the layer adds, the conv's new input, St', and when
        ``blocks`` M (B, H_v, d_k, d_k), else None)."""
        m, B = layer.linear_attn, hn.shape[0]
        Hk, Hv, dk, dv, r = self.Hk, self.Hv, self.dk, self.dv, self.Hv // self.Hk
        qkvz = m.in_proj_qkvz(hn).reshape(B, Hk, 2 * dk + 2 * r * dv)
        q, k, v, zg = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=-1)
        b, a = torch.split(m.in_proj_ba(hn).reshape(B, Hk, 2 * r), [r, r], dim=-1)
        u = torch.cat([q.reshape(B, -1), k.reshape(B, -1), v.reshape(B, -1)], dim=-1)  # the conv's new input
        w = m.conv1d.weight[:, 0, :]
        c = F.silu((window * w[:, :-1]).sum(-1) + u * w[:, -1])
        q, k, v = torch.split(c, [Hk * dk, Hk * dk, Hv * dv], dim=-1)
        q = l2norm(q.reshape(B, Hk, dk)).repeat_interleave(r, dim=1) / math.sqrt(dk)  # (B, Hv, dk)
        k = l2norm(k.reshape(B, Hk, dk)).repeat_interleave(r, dim=1)
        v = v.reshape(B, Hv, dv)
        beta = torch.sigmoid(b.reshape(B, Hv))
        alpha = torch.exp(-torch.exp(m.A_log) * F.softplus(a.reshape(B, Hv) + m.dt_bias))  # (B, Hv)
        Sk = (St * k[:, :, None, :]).sum(-1)  # (B, Hv, dv): Sᵀk
        delta = beta[..., None] * (v - alpha[..., None] * Sk)
        new = alpha[..., None, None] * St + delta[..., None] * k[:, :, None, :]
        o = (new * q[:, :, None, :]).sum(-1)  # (B, Hv, dv): S'ᵀq
        o = rms(o, m.norm.variance_epsilon) * m.norm.weight * F.silu(zg.reshape(B, Hv, dv))
        M = None
        if blocks:  # the step's own block a head, only where the diagonal blocks are asked for
            eye = torch.eye(dk, dtype=hn.dtype, device=hn.device)
            M = alpha[..., None, None] * (eye - (beta[..., None, None] * k[..., :, None]) * k[..., None, :])
        return m.out_proj(o.reshape(B, Hv * dv)), u, new, M

    def _attention(self, layer: nn.Module, hn: Tensor, keys: Tensor, values: Tensor, t: int
                   ) -> tuple[Tensor, Tensor, Tensor]:
        """One gated attention step at position t → (what the layer adds, keys', values')."""
        return attention_step(layer.self_attn, hn, keys, values, t, self.Hq, self.Hkv, self.hd,
                              rotary_emb=self.model.rotary_emb, norm=norm1p, gated=True)

    def jacobian_structure(self) -> JacobianStructure:
        """One block per entry, each delta entry one block per head (:meth:`LibraryCore.delta_structure`)."""
        return self.delta_structure(self.Hv, self.dk, self.dv)

    def step_tangents(self, x: Tensor, z: Tensor, dz: Tensor, t: int | None = None,
                      out: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One step and its forward-mode products for tangents dz (m, B, D), derived by hand
        (:func:`gradscope.models.core.step_tangents`'s shapes): the primal runs once, each projection
        multiplies the primal and its m tangents in one call. A delta head's state takes
        dS' = α dS + dα S + dδ ⊗ k + δ ⊗ dk with δ = β(v − α Sᵀk); attention's softmax
        dp = p ⊙ (ds − Σ p ds). ``out``: buffers like (z, dz) for z' and dz'. The tests compare it with
        ``torch.func`` in float64."""
        with torch.no_grad():
            return self._step_tangents(x, z, dz, t, out)

    def _step_tangents(self, x: Tensor, z: Tensor, dz: Tensor, t: int | None,
                       out: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        z_out, dz_out = (torch.empty_like(z), torch.empty_like(dz)) if out is None else out
        h, dh = x, None  # the step's input has no tangent
        for i, layer in enumerate(self.model.layers[:self.num_layers]):
            hn, dhn = norm1p_jvp(layer.input_layernorm, h, dh)
            if self.types[i] == "linear_attention":
                res, dres = self._delta_jvp(layer, i, hn, dhn, z, dz, z_out, dz_out)
            else:
                step = check_position(t, self.positions, self.family)
                res, dres = self._attention_jvp(layer, i, hn, dhn, z, dz, z_out, dz_out, step)
            h, dh = h + res, _add(dh, dres)
            res, dres = mlp_jvp(layer.mlp, *norm1p_jvp(layer.post_attention_layernorm, h, dh))
            h, dh = h + res, _add(dh, dres)
        y, dy = norm1p_jvp(self.model.norm, h, dh)
        if dy is None:  # no layer carries a state (not a model the adapter builds)
            dy = y.new_zeros(dz.shape[0], *y.shape)
        return y, z_out, dy, dz_out

    def _delta_jvp(self, layer: nn.Module, i: int, hn: Tensor, dhn: Tensor | None, z: Tensor, dz: Tensor,
                   z_out: Tensor, dz_out: Tensor) -> tuple[Tensor, Tensor]:
        m, B, M = layer.linear_attn, hn.shape[0], dz.shape[0]
        Hk, Hv, dk, dv, r, C, K = self.Hk, self.Hv, self.dk, self.dv, self.Hv // self.Hk, self.C, self.K
        sc, sd = self._slices[f"l{i}/conv"], self._slices[f"l{i}/delta"]

        def heads(v: Tensor | None, *shape: int) -> Tensor | None:
            return None if v is None else v.reshape(*v.shape[:-1], *shape)

        qkvz, dqkvz = linear_jvp(m.in_proj_qkvz, hn, dhn)
        ba, dba = linear_jvp(m.in_proj_ba, hn, dhn)
        split = [dk, dk, r * dv, r * dv]
        q, k, v, zg = torch.split(heads(qkvz, Hk, 2 * dk + 2 * r * dv), split, dim=-1)
        dparts = (None,) * 4 if dqkvz is None else torch.split(heads(dqkvz, Hk, 2 * dk + 2 * r * dv), split, dim=-1)
        b, a = torch.split(heads(ba, Hk, 2 * r), [r, r], dim=-1)
        db, da = (None, None) if dba is None else torch.split(heads(dba, Hk, 2 * r), [r, r], dim=-1)
        flat = lambda p: p.flatten(-2)  # noqa: E731 - (…, heads, d) → (…, heads·d)
        u = torch.cat([flat(q), flat(k), flat(v)], dim=-1)
        du = None if dqkvz is None else torch.cat([flat(dparts[0]), flat(dparts[1]), flat(dparts[2])], dim=-1)
        window, dwindow = z[:, sc].reshape(B, C, K - 1), dz[:, :, sc].reshape(M, B, C, K - 1)
        c, dc = conv_silu_jvp(m.conv1d, window, dwindow, u, du)
        shift_window_jvp(z_out[:, sc].view(B, C, K - 1), dz_out[:, :, sc].view(M, B, C, K - 1), window, dwindow, u, du)
        q, k, v = torch.split(c, [Hk * dk, Hk * dk, Hv * dv], dim=-1)
        dq, dk_, dv_ = torch.split(dc, [Hk * dk, Hk * dk, Hv * dv], dim=-1)
        q, dq = l2norm_jvp(q.reshape(B, Hk, dk), dq.reshape(M, B, Hk, dk))
        k, dk_ = l2norm_jvp(k.reshape(B, Hk, dk), dk_.reshape(M, B, Hk, dk))
        scale = 1.0 / math.sqrt(dk)
        q, dq = q.repeat_interleave(r, dim=-2) * scale, dq.repeat_interleave(r, dim=-2) * scale  # (…, Hv, dk)
        k, dk_ = k.repeat_interleave(r, dim=-2), dk_.repeat_interleave(r, dim=-2)
        v, dv_ = v.reshape(B, Hv, dv), dv_.reshape(M, B, Hv, dv)
        beta = torch.sigmoid(b.reshape(B, Hv))
        pre = a.reshape(B, Hv) + m.dt_bias
        decay = torch.exp(m.A_log)
        alpha = torch.exp(-decay * F.softplus(pre))
        dbeta = None if db is None else beta * (1 - beta) * db.reshape(M, B, Hv)
        dalpha = None if da is None else alpha * (-decay * torch.sigmoid(pre)) * da.reshape(M, B, Hv)
        St, dSt = z[:, sd].reshape(B, Hv, dv, dk), dz[:, :, sd].reshape(M, B, Hv, dv, dk)
        Sk = (St @ k[..., None])[..., 0]  # (B, Hv, dv): Sᵀk
        dSk = (dSt @ k[..., None])[..., 0] + (St @ dk_[..., None])[..., 0]
        res = v - alpha[..., None] * Sk
        delta = beta[..., None] * res
        ddelta = beta[..., None] * (dv_ - alpha[..., None] * dSk)
        if dalpha is not None:
            ddelta = ddelta - beta[..., None] * dalpha[..., None] * Sk
        if dbeta is not None:
            ddelta = ddelta + dbeta[..., None] * res
        new = z_out[:, sd].view(B, Hv, dv, dk)
        torch.mul(St, alpha[..., None, None], out=new)
        new.addcmul_(delta[..., None], k[:, :, None, :])
        dnew = dz_out[:, :, sd].view(M, B, Hv, dv, dk)
        torch.mul(dSt, alpha[..., None, None], out=dnew)
        if dalpha is not None:
            dnew.addcmul_(dalpha[..., None, None], St)
        dnew.addcmul_(ddelta[..., None], k[:, :, None, :])
        dnew.addcmul_(delta[..., None], dk_[..., None, :])
        o = (new @ q[..., None])[..., 0]  # (B, Hv, dv): S'ᵀq
        do = (dnew @ q[..., None])[..., 0] + (new @ dq[..., None])[..., 0]
        zg, dzg = zg.reshape(B, Hv, dv), None if dparts[3] is None else dparts[3].reshape(M, B, Hv, dv)
        on, don = rms_jvp(o, do, m.norm.variance_epsilon)
        gate = F.silu(zg)
        w = m.norm.weight
        y = on * w * gate
        dy = don * w * gate if dzg is None else don * w * gate + on * w * silu_grad(zg) * dzg
        return linear_jvp(m.out_proj, y.reshape(B, Hv * dv), dy.reshape(M, B, Hv * dv))

    def _attention_jvp(self, layer: nn.Module, i: int, hn: Tensor, dhn: Tensor | None, z: Tensor, dz: Tensor,
                       z_out: Tensor, dz_out: Tensor, t: int) -> tuple[Tensor, Tensor]:
        a, B, M, d = layer.self_attn, hn.shape[0], dz.shape[0], self.hd
        Hq, Hkv, P = self.Hq, self.Hkv, self.positions
        qg, dqg = linear_jvp(a.q_proj, hn, dhn)
        q, gate = torch.chunk(qg.reshape(B, Hq, 2 * d), 2, dim=-1)
        dq, dgate = (None, None) if dqg is None else torch.chunk(dqg.reshape(M, B, Hq, 2 * d), 2, dim=-1)
        q, dq = norm1p_jvp(a.q_norm, q, dq)
        kk, dkk = linear_jvp(a.k_proj, hn, dhn)
        k, dk_ = norm1p_jvp(a.k_norm, kk.reshape(B, Hkv, d), None if dkk is None else dkk.reshape(M, B, Hkv, d))
        v, dv_ = linear_jvp(a.v_proj, hn, dhn)
        v, dv_ = v.reshape(B, Hkv, d), None if dv_ is None else dv_.reshape(M, B, Hkv, d)
        cos, sin = rotary(self.model.rotary_emb, hn, t)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        dq = None if dq is None else rope(dq, cos, sin)
        dk_ = None if dk_ is None else rope(dk_, cos, sin)
        caches = []
        for part, new_p, dnew_p in (("keys", k, dk_), ("values", v, dv_)):
            sl = self._slices[f"l{i}/{part}"]
            cache, dcache = z_out[:, sl].view(B, P, Hkv, d), dz_out[:, :, sl].view(M, B, P, Hkv, d)
            cache.copy_(z[:, sl].view(B, P, Hkv, d))
            dcache.copy_(dz[:, :, sl].view(M, B, P, Hkv, d))
            cache[:, t] = new_p
            dcache[:, :, t] = 0 if dnew_p is None else dnew_p
            caches.append((cache[:, :t + 1], dcache[:, :, :t + 1]))
        (K_, dK), (V_, dV) = caches
        R = Hq // Hkv
        qh = q.reshape(B, Hkv, R, d)
        s = torch.einsum("bgrd,bsgd->bgrs", qh, K_) * a.scaling
        p = torch.softmax(s, dim=-1)
        ds = torch.einsum("bgrd,mbsgd->mbgrs", qh, dK)
        if dq is not None:
            ds = ds + torch.einsum("mbgrd,bsgd->mbgrs", dq.reshape(M, B, Hkv, R, d), K_)
        ds = ds * a.scaling
        dp = p * (ds - (p * ds).sum(-1, keepdim=True))
        o = torch.einsum("bgrs,bsgd->bgrd", p, V_).reshape(B, Hq * d)
        do = (torch.einsum("mbgrs,bsgd->mbgrd", dp, V_) + torch.einsum("bgrs,mbsgd->mbgrd", p, dV)).reshape(M, B, Hq * d)
        sg = torch.sigmoid(gate.reshape(B, Hq * d))
        dy = do * sg if dgate is None else do * sg + o * sg * (1 - sg) * dgate.reshape(M, B, Hq * d)
        return linear_jvp(a.o_proj, o * sg, dy)

    def chain_tangents(self, x: Tensor, z: Tensor, dz: Tensor, t: int | None = None) -> tuple[Tensor, Tensor]:
        """The last output of the steps over x (B, L, in) from z (B, D), the first at time index t, and its
        forward-mode products for tangents dz (m, B, D) on z: (y_L (B, H), ∂y_L/∂z · dz (m, B, H))
        (:func:`gradscope.models.core.chain_tangents`). Equal to chaining :meth:`step_tangents` L times, but
        layer by layer: a layer's projections, norms and MLP take all L steps' (1 + m)·B rows in one matrix
        product each (a step's B rows leave the matrix units idle), and only the delta rule's recurrence and
        attention's causal mask go step by step. The tests compare it with ``torch.func``'s steps chained."""
        start = 0 if t is None else int(t)
        check_position(start + x.shape[1] - 1, self.positions, self.family)
        with torch.no_grad():
            h, dh = x, None
            last = self.num_layers - 1
            for i, layer in enumerate(self.model.layers[:self.num_layers]):
                hn, dhn = norm1p_jvp(layer.input_layernorm, h, dh)
                if self.types[i] == "linear_attention":
                    res, dres = self._delta_span(layer, i, hn, dhn, z, dz)
                else:
                    res, dres = self._attention_span(layer, i, hn, dhn, z, dz, start)
                h, dh = h + res, _add(dh, dres)
                if i == last:  # only the last step's output is asked for
                    h, dh = h[:, -1], dh[:, :, -1]
                hn, dhn = norm1p_jvp(layer.post_attention_layernorm, h, dh)
                shape = hn.shape
                res, dres = mlp_jvp(layer.mlp, hn.reshape(-1, shape[-1]), dhn.reshape(dhn.shape[0], -1, shape[-1]))
                h, dh = h + res.reshape(shape), dh + dres.reshape(dhn.shape)
            y, dy = norm1p_jvp(self.model.norm, h, dh)
            return y, dy

    def _delta_span(self, layer: nn.Module, i: int, hn: Tensor, dhn: Tensor | None, z: Tensor, dz: Tensor
                    ) -> tuple[Tensor, Tensor]:
        """A Gated DeltaNet layer over a span: hn (B, L, hidden) → (what it adds (B, L, hidden), its tangents)."""
        m, (B, L, _), M = layer.linear_attn, hn.shape, dz.shape[0]
        Hk, Hv, dk, dv, r, C, K = self.Hk, self.Hv, self.dk, self.dv, self.Hv // self.Hk, self.C, self.K
        sc, sd = self._slices[f"l{i}/conv"], self._slices[f"l{i}/delta"]
        width = 2 * dk + 2 * r * dv
        qkvz, dqkvz = linear_jvp(m.in_proj_qkvz, hn, dhn)
        ba, dba = linear_jvp(m.in_proj_ba, hn, dhn)
        q, k, v, zg = torch.split(qkvz.reshape(B, L, Hk, width), [dk, dk, r * dv, r * dv], dim=-1)
        u = torch.cat([q.flatten(-2), k.flatten(-2), v.flatten(-2)], dim=-1)  # (B, L, C)
        b, a = torch.split(ba.reshape(B, L, Hk, 2 * r), [r, r], dim=-1)
        window, dwindow = z[:, sc].reshape(B, C, K - 1), dz[:, :, sc].reshape(M, B, C, K - 1)
        U = torch.cat([window.transpose(1, 2), u], dim=1)  # (B, K − 1 + L, C): the inputs the conv reads
        if dqkvz is None:
            dzg = db = da = None
            dU = torch.cat([dwindow.transpose(2, 3), dwindow.new_zeros(M, B, L, C)], dim=2)
        else:
            dq, dk_, dv_, dzg = torch.split(dqkvz.reshape(M, B, L, Hk, width), [dk, dk, r * dv, r * dv], dim=-1)
            du = torch.cat([dq.flatten(-2), dk_.flatten(-2), dv_.flatten(-2)], dim=-1)  # (M, B, L, C)
            dU = torch.cat([dwindow.transpose(2, 3), du], dim=2)
            db, da = torch.split(dba.reshape(M, B, L, Hk, 2 * r), [r, r], dim=-1)
        w = m.conv1d.weight[:, 0, :]  # (C, K)
        pre = sum(U[:, j:j + L] * w[:, j] for j in range(K))
        dpre = sum(dU[:, :, j:j + L] * w[:, j] for j in range(K))
        c, dc = F.silu(pre), dpre * silu_grad(pre)
        q, k, v = torch.split(c, [Hk * dk, Hk * dk, Hv * dv], dim=-1)
        dq, dk_, dv_ = torch.split(dc, [Hk * dk, Hk * dk, Hv * dv], dim=-1)
        q, dq = l2norm_jvp(q.reshape(B, L, Hk, dk), dq.reshape(M, B, L, Hk, dk))
        k, dk_ = l2norm_jvp(k.reshape(B, L, Hk, dk), dk_.reshape(M, B, L, Hk, dk))
        scale = 1.0 / math.sqrt(dk)
        q, dq = q.repeat_interleave(r, dim=-2) * scale, dq.repeat_interleave(r, dim=-2) * scale  # (…, L, Hv, dk)
        k, dk_ = k.repeat_interleave(r, dim=-2), dk_.repeat_interleave(r, dim=-2)
        v, dv_ = v.reshape(B, L, Hv, dv), dv_.reshape(M, B, L, Hv, dv)
        beta = torch.sigmoid(b.reshape(B, L, Hv))
        pre_a = a.reshape(B, L, Hv) + m.dt_bias
        decay = torch.exp(m.A_log)
        alpha = torch.exp(-decay * F.softplus(pre_a))
        dbeta = None if db is None else beta * (1 - beta) * db.reshape(M, B, L, Hv)
        dalpha = None if da is None else alpha * (-decay * torch.sigmoid(pre_a)) * da.reshape(M, B, L, Hv)
        St = z[:, sd].reshape(B, Hv, dv, dk).clone()
        dSt = dz[:, :, sd].reshape(M, B, Hv, dv, dk).clone()
        o = hn.new_empty(B, L, Hv, dv)
        do = hn.new_empty(M, B, L, Hv, dv)
        def columns(S: Tensor, primal: Tensor, tangents: Tensor) -> tuple[Tensor, Tensor]:
            """(S a, S da) for a head's vector a (B, Hv, dk) and its tangents (M, B, Hv, dk): one batched
            matrix product a head over the 1 + M columns."""
            cols = torch.cat([primal[None], tangents]).permute(1, 2, 3, 0).reshape(B * Hv, dk, 1 + M)
            out = (S.reshape(B * Hv, dv, dk) @ cols).reshape(B, Hv, dv, 1 + M).permute(3, 0, 1, 2)
            return out[0], out[1:]

        for j in range(L):  # the recurrence, step by step, in place
            kj, dkj, al = k[:, j], dk_[:, :, j], alpha[:, j, :, None]
            Sk, SdK = columns(St, kj, dkj)  # Sᵀk (B, Hv, dv) and Sᵀdk
            dSk = torch.linalg.vecdot(dSt, kj[:, :, None, :]) + SdK
            res = v[:, j] - al * Sk
            delta = beta[:, j, :, None] * res
            ddelta = beta[:, j, :, None] * (dv_[:, :, j] - al * dSk)
            dSt.mul_(al[..., None])
            if dalpha is not None:
                ddelta -= beta[:, j, :, None] * dalpha[:, :, j, :, None] * Sk
                dSt.addcmul_(dalpha[:, :, j, :, None, None], St)
            if dbeta is not None:
                ddelta += dbeta[:, :, j, :, None] * res
            dSt.addcmul_(ddelta[..., None], kj[:, :, None, :])
            dSt.addcmul_(delta[..., None], dkj[..., None, :])
            St.mul_(al[..., None]).addcmul_(delta[..., None], kj[:, :, None, :])
            qj = q[:, j]
            o[:, j], SdQ = columns(St, qj, dq[:, :, j])
            do[:, :, j] = torch.linalg.vecdot(dSt, qj[:, :, None, :]) + SdQ
        zg = zg.reshape(B, L, Hv, dv)
        on, don = rms_jvp(o, do, m.norm.variance_epsilon)
        gate, wn = F.silu(zg), m.norm.weight
        y = on * wn * gate
        dy = don * wn * gate if dzg is None else don * wn * gate + on * wn * silu_grad(zg) * dzg.reshape(M, B, L, Hv, dv)
        return linear_jvp(m.out_proj, y.reshape(B, L, Hv * dv), dy.reshape(M, B, L, Hv * dv))

    def _attention_span(self, layer: nn.Module, i: int, hn: Tensor, dhn: Tensor | None, z: Tensor, dz: Tensor,
                        t: int) -> tuple[Tensor, Tensor]:
        """A gated attention layer over a span whose first step is at position t (causal within the span)."""
        a, (B, L, _), M, d = layer.self_attn, hn.shape, dz.shape[0], self.hd
        Hq, Hkv, P, R = self.Hq, self.Hkv, self.positions, self.Hq // self.Hkv
        qg, dqg = linear_jvp(a.q_proj, hn, dhn)
        q, gate = torch.chunk(qg.reshape(B, L, Hq, 2 * d), 2, dim=-1)
        dq, dgate = (None, None) if dqg is None else torch.chunk(dqg.reshape(M, B, L, Hq, 2 * d), 2, dim=-1)
        q, dq = norm1p_jvp(a.q_norm, q, dq)
        kk, dkk = linear_jvp(a.k_proj, hn, dhn)
        k, dk_ = norm1p_jvp(a.k_norm, kk.reshape(B, L, Hkv, d), None if dkk is None else dkk.reshape(M, B, L, Hkv, d))
        v, dv_ = linear_jvp(a.v_proj, hn, dhn)
        v = v.reshape(B, L, Hkv, d)
        positions = torch.arange(t, t + L, device=hn.device).expand(B, L)
        cos, sin = (c.to(hn.dtype)[:, :, None, :] for c in self.model.rotary_emb(hn, positions))  # (B, L, 1, rot)

        def rot(x: Tensor | None) -> Tensor | None:
            if x is None:
                return None
            n = cos.shape[-1]
            out = x[..., :n] * cos + rotate_half(x[..., :n]) * sin
            return out if n == x.shape[-1] else torch.cat([out, x[..., n:]], dim=-1)

        q, k, dq, dk_ = rot(q), rot(k), rot(dq), rot(dk_)
        sk, sv = self._slices[f"l{i}/keys"], self._slices[f"l{i}/values"]
        K_ = torch.cat([z[:, sk].reshape(B, P, Hkv, d)[:, :t], k], dim=1)  # (B, t + L, Hkv, d)
        V_ = torch.cat([z[:, sv].reshape(B, P, Hkv, d)[:, :t], v], dim=1)
        zeros = hn.new_zeros(M, B, L, Hkv, d)
        dK = torch.cat([dz[:, :, sk].reshape(M, B, P, Hkv, d)[:, :, :t], zeros if dk_ is None else dk_], dim=2)
        dV = torch.cat([dz[:, :, sv].reshape(M, B, P, Hkv, d)[:, :, :t],
                        zeros if dv_ is None else dv_.reshape(M, B, L, Hkv, d)], dim=2)
        mask = torch.arange(t + L, device=hn.device)[None, :] <= torch.arange(t, t + L, device=hn.device)[:, None]
        qh = q.reshape(B, L, Hkv, R, d)
        s = torch.einsum("blgrd,bsgd->bgrls", qh, K_) * a.scaling
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
        ds = torch.einsum("blgrd,mbsgd->mbgrls", qh, dK)
        if dq is not None:
            ds = ds + torch.einsum("mblgrd,bsgd->mbgrls", dq.reshape(M, B, L, Hkv, R, d), K_)
        ds = ds * a.scaling
        dp = p * (ds - (p * ds).sum(-1, keepdim=True))
        o = torch.einsum("bgrls,bsgd->blgrd", p, V_).reshape(B, L, Hq * d)
        do = (torch.einsum("mbgrls,bsgd->mblgrd", dp, V_) + torch.einsum("bgrls,mbsgd->mblgrd", p, dV)
              ).reshape(M, B, L, Hq * d)
        sg = torch.sigmoid(gate.reshape(B, L, Hq * d))
        dy = do * sg if dgate is None else do * sg + o * sg * (1 - sg) * dgate.reshape(M, B, L, Hq * d)
        return linear_jvp(a.o_proj, o * sg, dy)

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B = x.shape[0]
        parts = self.unpack(z)
        new: dict[str, Tensor] = {}
        diag: list[Tensor] = []  # the blocks of jacobian_structure, in order
        h = x
        for i, layer in enumerate(self.model.layers[:self.num_layers]):
            hn = norm1p(layer.input_layernorm, h)
            if self.types[i] == "linear_attention":
                window = parts[f"l{i}/conv"]
                out, u, St, M = self._delta(layer, hn, window, parts[f"l{i}/delta"], diagonal)
                new[f"l{i}/conv"] = torch.cat([window[..., 1:], u[..., None]], dim=-1)
                new[f"l{i}/delta"] = St
                if diagonal:
                    diag.append(shift_blocks(B, self.C, self.K - 1, x))
                    diag += [M[:, j, None].expand(B, self.dv, self.dk, self.dk) for j in range(self.Hv)]
            else:
                step = check_position(t, self.positions, self.family)
                out, keys, values = self._attention(layer, hn, parts[f"l{i}/keys"], parts[f"l{i}/values"], step)
                new[f"l{i}/keys"], new[f"l{i}/values"] = keys, values
                if diagonal:
                    diag += [cache_diagonal(B, self.positions, self.Hkv * self.hd, step, x)] * 2
            h = h + out
            h = h + mlp_step(layer.mlp, norm1p(layer.post_attention_layernorm, h))
        y = norm1p(self.model.norm, h)
        return y, self.pack(new), diag


def adapt(model: nn.Module, positions: int = POSITIONS) -> Adapted:
    """The adapter of a ``Qwen3NextForCausalLM``/``Qwen3NextModel``, with ``positions`` attention cache slots."""
    backbone = getattr(model, "model", model)
    check(hasattr(backbone, "layers") and hasattr(backbone, "embed_tokens"),
          f"model: {type(model).__name__} has no Qwen3-Next backbone (embed_tokens, layers)")
    return Adapted(HFQwen3NextCore(backbone, positions), TokenMap(backbone.embed_tokens),
                   getattr(model, "lm_head", None), hf_forward(model), TOLERANCE)


__all__ = ["HFQwen3NextCore", "TOLERANCE", "adapt"]
