"""transformers' Kimi Linear (``KimiLinearForCausalLM``, ``KimiLinearModel``): Kimi Delta Attention (KDA) layers and
multi-head latent attention (MLA) layers, with dense or mixture-of-experts MLPs, as a gradscope core.

One step per decoder layer, as the library's one-token paths compute it, in the model's dtype (the library runs
its delta rule, gate, RMSNorms, router and softmax in float32; the adapter does not)::

    ĥ = RMSNorm(h)                                   # w · x / rms(x)
    KDA (linear attention), H heads of d (keys and values alike):
        q, k, v = act(causal conv over [window, (q_proj ĥ, k_proj ĥ, v_proj ĥ)])   # depthwise, K taps, no bias
        q, k = l2norm(q), l2norm(k);  q /= sqrt(d)
        β = σ(b_proj ĥ)                                                          # one per head
        α = exp(−exp(A_log_h) · softplus(f_b(f_a ĥ) + dt_bias))                 # one per head and key channel
        S' = (I − β k kᵀ) Diag(α) S + β k vᵀ                                   # S (d_k, d_v): the library's order
        o = S'ᵀ q;  out = o_proj(w · o / rms(o) · σ(g_b(g_a ĥ)))                # per head
    MLA (full attention, no positional embedding at all):
        q = q_proj ĥ (or q_b(RMSNorm(q_a ĥ)) with q_lora_rank) = (q_nope, q_rope) per head
        c, r = kv_a_proj_with_mqa ĥ;  c = RMSNorm(c)                            # the latent (kv_lora_rank), the shared key part
        slot t of the cache ← (c, r)
        keys_s = (W_uk c_s per head, r_s);  values_s = W_uv c_s per head         # kv_b_proj = (W_uk; W_uv) per head
        o = softmax(q · keys / sqrt(d_nope + d_rope)) values over slots ≤ t;  out = o_proj(o)
    h += out;  h += MLP(RMSNorm(h))        # SwiGLU, or the MoE: grouped sigmoid router, top-k experts + shared experts

The adapter attends in DeepSeek's absorbed form (q_nope W_uk · c_s and W_uv Σ_s p_s c_s: the same numbers, the
latent decompressed once per step instead of once per slot).

State layout, layer 0 first: a KDA layer has ``l<i>/conv`` (3 H d, K−1), the last K−1 conv inputs per channel,
oldest first, and ``l<i>/delta`` (H, d_v, d_k): each head's S **transposed**, so that the step on it,
M_t ⊗ I over S's d_v columns with M_t = (I − β k kᵀ) Diag(α) (d_k × d_k), is d_v consecutive copies of M_t
(block_diagonal, size d_k, repeat d_v; one declared block a head, ``l<i>/delta/h<j>``): a head's exponents are
M's cocycle's d_k, each with multiplicity d_v. An MLA layer has what the library's cache holds for it:
``l<i>/keys`` (positions, 1, kv_lora_rank), the normed latent c, and ``l<i>/values`` (positions, 1,
qk_rope_head_dim), the shared key part r (the library stores c as its cache layer's ``keys`` and r as its
``values``; the per-head keys and values are linear in them), both held by the spectra
(:mod:`~gradscope.models.adapters.attention`). The step is position-dependent (the cache slot).

Output y_t: the backbone's last hidden state (``norm`` of the residual stream); readout: ``lm_head`` for
``KimiLinearForCausalLM``, none for ``KimiLinearModel``. Jacobian products: ``torch.func``'s.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.attention import (POSITIONS, CacheSlots, cache_diagonal, check_position,
                                                 check_positions, write_slot)
from gradscope.models.adapters.base import Adapted, Entry, LibraryCore, TokenMap, conv_pre, hf_forward, rms, shift_blocks
from gradscope.models.adapters.base import rms_norm as norm
from gradscope.models.adapters.hf_qwen3_next import l2norm, swiglu
from gradscope.models.structure import JacobianStructure

TOLERANCE = 1e-4
LAYERS = ("linear_attention", "full_attention")
MLPS = ("dense", "sparse")



def mla_cache_entries(i: int, positions: int, latent: int, rope: int) -> list[Entry]:
    """MLA layer i's state entries as the library caches them: ``keys`` the latent (positions, 1, latent) and
    ``values`` the shared key part (positions, 1, rope), held (:func:`attention.cache_entries` with per-entry
    widths)."""
    return [Entry(f"l{i}/keys", (positions, 1, latent), "diagonal", held=True),
            Entry(f"l{i}/values", (positions, 1, rope), "diagonal", held=True)]


def kimi_moe(moe: nn.Module, x: Tensor) -> Tensor:
    """Kimi Linear's MoE block on one token per sequence, x (B, hidden), functionally: the router's sigmoid
    scores s; the experts chosen on s + e_score_correction_bias within the ``topk_group`` best of ``n_group``
    groups (a group's worth: its two best), top-k of those; their weights s (renormalised over the k when
    ``norm_topk_prob``, + 1e-20 as the library) times ``routed_scaling_factor``; each expert's SwiGLU read by
    gathering its weights per token (no data-dependent loop, so torch.func transforms it), plus the shared
    experts' SwiGLU. The routing is piecewise constant: its derivative is that of the chosen weights and
    experts."""
    router, experts = moe.gate, moe.experts
    B, E, G = x.shape[0], router.num_experts, router.num_group
    scores = torch.sigmoid(F.linear(x, router.weight.to(x.dtype)))  # (B, E)
    choice = scores + router.e_score_correction_bias.to(x.dtype)
    group_scores = choice.reshape(B, G, E // G).topk(2, dim=-1)[0].sum(-1)  # (B, G)
    group_idx = torch.topk(group_scores, k=router.topk_group, dim=-1)[1]
    group_mask = torch.zeros_like(group_scores).scatter(1, group_idx, 1.0)
    keep = group_mask[..., None].expand(B, G, E // G).reshape(B, E) > 0
    index = torch.topk(choice.masked_fill(~keep, float("-inf")), k=router.top_k, dim=-1)[1]  # (B, k)
    top = scores.gather(1, index)
    if router.norm_topk_prob:
        top = top / (top.sum(-1, keepdim=True) + 1e-20)
    top = top * router.routed_scaling_factor
    gate_up = experts.gate_up_proj[index]  # (B, k, 2I, hidden)
    gate, up = torch.einsum("bkoh,bh->bko", gate_up, x).chunk(2, dim=-1)
    act = experts.act_fn(gate) * up  # (B, k, I)
    out = torch.einsum("bkhi,bki->bkh", experts.down_proj[index], act)  # (B, k, hidden)
    return (out * top[..., None]).sum(1) + swiglu(moe.shared_experts, x)


def mlp_step(mlp: nn.Module, x: Tensor) -> Tensor:
    """A decoder layer's MLP on x (B, hidden): the MoE where the layer has one, else the SwiGLU."""
    return kimi_moe(mlp, x) if hasattr(mlp, "experts") else swiglu(mlp, x)


class HFKimiLinearCore(CacheSlots, LibraryCore):
    """gradscope core over a transformers ``KimiLinearModel`` (held by reference)."""

    name = "hf-kimi-linear"
    label = "Kimi Linear (transformers)"
    library = "transformers"
    family = "Kimi Linear"
    position_dependent = True

    def __init__(self, backbone: nn.Module, positions: int = POSITIONS) -> None:
        cfg = backbone.config
        check(str(cfg.hidden_act) in ("silu", "swish"), f"model: hidden_act={cfg.hidden_act!r}; the adapter knows "
                                                        f"Kimi Linear with SiLU")
        n = int(cfg.num_hidden_layers)
        self.types = tuple(cfg.layer_types[:n])
        unknown = sorted(set(self.types) - set(LAYERS), key=str)
        check(not unknown, f"model: layer types {unknown} are not ones the Kimi Linear adapter knows ({', '.join(LAYERS)})")
        mlps = sorted(set(cfg.mlp_layer_types[:n]) - set(MLPS), key=str)
        check(not mlps, f"model: mlp layer types {mlps} are not ones the Kimi Linear adapter knows ({', '.join(MLPS)})")
        self.H, self.d, self.K = int(cfg.linear_num_heads), int(cfg.linear_head_dim), int(cfg.linear_conv_kernel_dim)
        check(self.K >= 2, f"model: linear_conv_kernel_dim={self.K}; the adapter needs a causal conv of width >= 2")
        self.C = 3 * self.H * self.d
        self.Hq = int(cfg.num_attention_heads)
        check("full_attention" not in self.types or int(cfg.num_key_value_heads) == self.Hq,
              f"model: num_key_value_heads={cfg.num_key_value_heads} with num_attention_heads={self.Hq}; Kimi Linear's "
              f"MLA decompresses one key and value per query head (the library's own forward needs them equal)")
        if "sparse" in cfg.mlp_layer_types[:n]:
            E, G = int(cfg.num_local_experts), int(cfg.n_group)
            check(E % G == 0 and E // G >= 2 and 1 <= int(cfg.topk_group) <= G,
                  f"model: {E} experts in n_group={G} groups with topk_group={cfg.topk_group}; the router needs groups "
                  f"of at least 2 experts and 1 <= topk_group <= n_group")
        self.nope, self.rope = int(cfg.qk_nope_head_dim), int(cfg.qk_rope_head_dim)
        self.vd, self.lat = int(cfg.v_head_dim), int(cfg.kv_lora_rank)
        self.positions = check_positions(positions)
        entries = []
        for i, kind in enumerate(self.types):
            if kind == "linear_attention":
                entries += [Entry(f"l{i}/conv", (self.C, self.K - 1), "block_diagonal", self.K - 1),
                            Entry(f"l{i}/delta", (self.H, self.d, self.d), "block_diagonal", self.d, self.d)]
            else:
                entries += mla_cache_entries(i, self.positions, self.lat, self.rope)
        super().__init__(backbone, entries, int(cfg.hidden_size))
        self.num_layers = n

    def _kda(self, m: nn.Module, hn: Tensor, window: Tensor, St: Tensor, blocks: bool
             ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """One KDA step from the normed stream hn (B, hidden), the conv window (B, C, K−1) and the transposed
        states St (B, H, d_v, d_k) → (what the layer adds, the conv's new input u (B, C), St', and when ``blocks``
        M (B, H, d_k, d_k), else None)."""
        B, H, d = hn.shape[0], self.H, self.d
        u = torch.cat([m.q_proj(hn), m.k_proj(hn), m.v_proj(hn)], dim=-1)  # (B, C): the conv's new input
        c = F.silu(conv_pre(m.conv1d, window, u))
        q, k, v = (part.reshape(B, H, d) for part in torch.split(c, [H * d] * 3, dim=-1))
        q, k = l2norm(q) / math.sqrt(d), l2norm(k)
        fg = m.forget_gate
        pre = fg.f_b_proj(fg.f_a_proj(hn)) + fg.dt_bias.to(hn.dtype)
        decay = torch.exp(fg.A_log.to(hn.dtype)).reshape(H, 1)
        alpha = torch.exp(-decay * F.softplus(pre.reshape(B, H, d)))  # (B, H, d_k): per key channel
        beta = torch.sigmoid(m.b_proj(hn))  # (B, H)
        decayed = St * alpha[:, :, None, :]  # Diag(α) S, transposed
        Sk = (decayed * k[:, :, None, :]).sum(-1)  # (B, H, d_v): (Diag(α) S)ᵀ k
        delta = beta[..., None] * (v - Sk)
        new = decayed + delta[..., None] * k[:, :, None, :]
        o = (new * q[:, :, None, :]).sum(-1)  # (B, H, d_v): S'ᵀ q
        gate = m.g_b_proj(m.g_a_proj(hn)).reshape(B, H, d)
        o = rms(o, m.o_norm.variance_epsilon) * m.o_norm.weight * torch.sigmoid(gate)
        M = None
        if blocks:  # (I − β k kᵀ) Diag(α): column j scaled by α_j
            eye = torch.eye(d, dtype=hn.dtype, device=hn.device)
            M = (eye - (beta[..., None, None] * k[..., :, None]) * k[..., None, :]) * alpha[..., None, :]
        return m.o_proj(o.reshape(B, H * d)), u, new, M

    def _mla(self, a: nn.Module, hn: Tensor, latents: Tensor, shared: Tensor, t: int) -> tuple[Tensor, Tensor, Tensor]:
        """One MLA step at position t on the normed stream hn (B, hidden) and its caches: latents (B, positions, 1,
        kv_lora_rank), shared key parts (B, positions, 1, rope) → (what the layer adds, latents', shared')."""
        B, Hq, nope, vd, lat = hn.shape[0], self.Hq, self.nope, self.vd, self.lat
        q = a.q_proj(hn) if a.q_lora_rank is None else a.q_b_proj(norm(a.q_a_layernorm, a.q_a_proj(hn)))
        q_nope, q_rope = torch.split(q.reshape(B, Hq, nope + self.rope), [nope, self.rope], dim=-1)
        c, r = torch.split(a.kv_a_proj_with_mqa(hn), [lat, self.rope], dim=-1)
        latents = write_slot(latents, norm(a.kv_a_layernorm, c)[:, None], t)
        shared = write_slot(shared, r[:, None], t)
        cs, rs = latents[:, :t + 1, 0], shared[:, :t + 1, 0]  # (B, t+1, lat), (B, t+1, rope)
        W = a.kv_b_proj.weight.reshape(Hq, nope + vd, lat)  # per head: W_uk (nope, lat) then W_uv (vd, lat)
        q_lat = torch.einsum("bhn,hnr->bhr", q_nope, W[:, :nope])  # the query against the latent
        scores = (torch.einsum("bhr,bsr->bhs", q_lat, cs) + torch.einsum("bhe,bse->bhs", q_rope, rs)) * a.scaling
        ctx = torch.einsum("bhs,bsr->bhr", torch.softmax(scores, dim=-1), cs)
        o = torch.einsum("bhr,hvr->bhv", ctx, W[:, nope:])  # (B, Hq, v_head_dim)
        return a.o_proj(o.reshape(B, Hq * vd)), latents, shared

    def jacobian_structure(self) -> JacobianStructure:
        """One block per entry, each delta entry one block per head (:meth:`LibraryCore.delta_structure`)."""
        return self.delta_structure(self.H, self.d, self.d)

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B = x.shape[0]
        parts = self.unpack(z)
        new: dict[str, Tensor] = {}
        diag: list[Tensor] = []  # the blocks of jacobian_structure, in order
        h = x
        for i, layer in enumerate(self.model.layers[:self.num_layers]):
            hn = norm(layer.input_layernorm, h)
            if self.types[i] == "linear_attention":
                window = parts[f"l{i}/conv"]
                out, u, St, M = self._kda(layer.self_attn, hn, window, parts[f"l{i}/delta"], diagonal)
                new[f"l{i}/conv"] = torch.cat([window[..., 1:], u[..., None]], dim=-1)
                new[f"l{i}/delta"] = St
                if diagonal:
                    diag.append(shift_blocks(B, self.C, self.K - 1, x))
                    diag += [M[:, j, None].expand(B, self.d, self.d, self.d) for j in range(self.H)]
            else:
                step = check_position(t, self.positions, self.family)
                out, latents, shared = self._mla(layer.self_attn, hn, parts[f"l{i}/keys"], parts[f"l{i}/values"], step)
                new[f"l{i}/keys"], new[f"l{i}/values"] = latents, shared
                if diagonal:
                    diag += [cache_diagonal(B, self.positions, width, step, x) for width in (self.lat, self.rope)]
            h = h + out
            h = h + mlp_step(layer.mlp, norm(layer.post_attention_layernorm, h))
        y = norm(self.model.norm, h)
        return y, self.pack(new), diag


def adapt(model: nn.Module, positions: int = POSITIONS) -> Adapted:
    """The adapter of a ``KimiLinearForCausalLM``/``KimiLinearModel``, with ``positions`` attention cache slots."""
    backbone = getattr(model, "model", model)
    check(hasattr(backbone, "layers") and hasattr(backbone, "embed_tokens"),
          f"model: {type(model).__name__} has no Kimi Linear backbone (embed_tokens, layers)")
    return Adapted(HFKimiLinearCore(backbone, positions), TokenMap(backbone.embed_tokens),
                   getattr(model, "lm_head", None), hf_forward(model), TOLERANCE)


__all__ = ["HFKimiLinearCore", "TOLERANCE", "adapt", "kimi_moe"]
