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
from gradscope.models.adapters.attention import (POSITIONS, attend, check_position, held_blocks, rope, rotary,
                                                 write_slot)
from gradscope.models.adapters.base import Adapted, Entry, LibraryCore, TokenMap, hf_forward, rms, shift_blocks
from gradscope.models.structure import JacobianStructure, StateBlock

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


class HFQwen3NextCore(LibraryCore):
    """gradscope core over a transformers ``Qwen3NextModel`` (held by reference)."""

    name = "hf-qwen3-next"
    label = "Qwen3-Next (transformers)"
    library = "transformers"
    family = "Qwen3-Next"
    position_dependent = True

    def __init__(self, backbone: nn.Module, positions: int = POSITIONS) -> None:
        cfg = backbone.config
        check(isinstance(positions, int) and positions >= 1, f"positions: got {positions!r}; expected a positive "
                                                              f"number of attention cache slots")
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
        self.positions = int(positions)
        entries = []
        for i, kind in enumerate(self.types):
            if kind == "linear_attention":
                entries += [Entry(f"l{i}/conv", (self.C, self.K - 1), "block_diagonal", self.K - 1),
                            Entry(f"l{i}/delta", (self.Hv, self.dv, self.dk), "block_diagonal", self.dk, self.dv)]
            else:
                entries += [Entry(f"l{i}/{part}", (self.positions, self.Hkv, self.hd), "diagonal", held=True)
                            for part in ("keys", "values")]
        super().__init__(backbone, entries, int(cfg.hidden_size))
        self.num_layers = len(self.types)

    def with_positions(self, positions: int) -> "HFQwen3NextCore":
        """The same model's core with ``positions`` attention cache slots (the library model by reference)."""
        return type(self)(self.model, positions)

    def _delta(self, layer: nn.Module, hn: Tensor, window: Tensor, St: Tensor
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One Gated DeltaNet step from the normed stream hn (B, hidden), the conv window (B, C, K−1) and the
        transposed states St (B, H_v, d_v, d_k) → (what the layer adds, the conv's new input, St', M (B, H_v,
        d_k, d_k))."""
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
        eye = torch.eye(dk, dtype=hn.dtype, device=hn.device)
        M = alpha[..., None, None] * (eye - (beta[..., None, None] * k[..., :, None]) * k[..., None, :])
        return m.out_proj(o.reshape(B, Hv * dv)), u, new, M

    def _attention(self, layer: nn.Module, hn: Tensor, keys: Tensor, values: Tensor, t: int
                   ) -> tuple[Tensor, Tensor, Tensor]:
        """One gated attention step at position t → (what the layer adds, keys', values')."""
        a, B, d = layer.self_attn, hn.shape[0], self.hd
        q, gate = torch.chunk(a.q_proj(hn).reshape(B, self.Hq, 2 * d), 2, dim=-1)
        q = norm1p(a.q_norm, q)
        k = norm1p(a.k_norm, a.k_proj(hn).reshape(B, self.Hkv, d))
        v = a.v_proj(hn).reshape(B, self.Hkv, d)
        cos, sin = rotary(self.model.rotary_emb, hn, t)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        keys, values = write_slot(keys, k, t), write_slot(values, v, t)
        o = attend(q, keys, values, t, a.scaling).reshape(B, self.Hq * d)
        return a.o_proj(o * torch.sigmoid(gate.reshape(B, self.Hq * d))), keys, values

    def jacobian_structure(self) -> JacobianStructure:
        """One block per entry, but each delta entry one block per value head (``l<i>/delta/h<j>``): a head's
        block is its own M_t repeated d_v times, which :meth:`diagonal_blocks` gives as an expanded view of
        one d_k × d_k matrix (no d_v copies in memory: at real size they were GBs a step)."""
        blocks = []
        width = self.dv * self.dk
        for e in self.entries:
            sl = self._slices[e.name]
            if e.name.endswith("/delta"):
                blocks += [StateBlock(f"{e.name}/h{j}", sl.start + j * width, sl.start + (j + 1) * width,
                                      "block_diagonal", self.dk, self.dv) for j in range(self.Hv)]
            else:
                blocks.append(StateBlock(e.name, sl.start, sl.stop, e.form, e.size, e.repeat, e.held))
        return JacobianStructure(tuple(blocks))

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
                out, u, St, M = self._delta(layer, hn, window, parts[f"l{i}/delta"])
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
                    diag += [held_blocks(B, self.positions, self.Hkv * self.hd, step, x)] * 2
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
