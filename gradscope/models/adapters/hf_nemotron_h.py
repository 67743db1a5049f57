"""transformers' Nemotron-H (``NemotronHForCausalLM``, ``NemotronHModel``): a stack of Mamba-2 blocks, attention
blocks (no positional embedding) and MLP blocks, as a gradscope core.

One step per block, in the model's dtype; each block is ``h += mixer(RMSNorm(h))`` (w · x / rms(x)) with the
mixer one of:

- Mamba-2 (``linear_attention``): the SSD step of :mod:`~gradscope.models.adapters.hf_mamba2`;
- attention (``full_attention``): q, k, v projections, slot t of the cache ← (k, v), o = softmax(q Kᵀ/√d) V
  over slots ≤ t, o_proj (Nemotron-H's attention has no rotary embedding);
- MLP (``mlp``): down(relu(up x)²), stateless;
- mixture of experts (``moe``): the top-k router (sigmoid scores, the correction bias only in the choice,
  group-limited top-k, the chosen scores renormalised when ``norm_topk_prob`` and scaled by
  ``routed_scaling_factor``), each chosen expert's relu² MLP (through the optional latent projections), plus
  the shared expert; stateless.

State layout, block 0 first: a Mamba-2 block has ``l<i>/conv`` and ``l<i>/ssm`` as in the Mamba-2 adapter; an
attention block ``l<i>/keys``, ``l<i>/values`` (positions, KV heads, head dim), held
(:mod:`~gradscope.models.adapters.attention`); an MLP block none. Position-dependent (the cache slot). Its
Jacobian products are ``torch.func``'s.

Output y_t: ``norm_f`` of the residual stream; readout: ``lm_head`` for ``NemotronHForCausalLM``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.attention import (POSITIONS, attention_step, cache_entries, check_position,
                                                 check_positions, cache_diagonal)
from gradscope.models.adapters.base import Adapted, LibraryCore, TokenMap, hf_forward, rms
from gradscope.models.adapters.hf_mamba2 import Mamba2HybridCore

TOLERANCE = 1e-4
KINDS = ("linear_attention", "full_attention", "mlp", "moe")


def relu2_mlp(mlp: nn.Module, x: Tensor) -> Tensor:
    """Nemotron-H's MLP: down(relu(up x)²)."""
    return mlp.down_proj(torch.relu(mlp.up_proj(x)) ** 2)


def moe_step(moe: nn.Module, x: Tensor) -> Tensor:
    """Nemotron-H's mixture of experts on x (B, hidden), in x's dtype (the library rounds its router to float32).
    The choice of experts is piecewise constant (no derivative); the weights are the chosen sigmoid scores."""
    router, experts = moe.gate, moe.experts
    scores = torch.sigmoid(x @ router.weight.to(x.dtype).T)  # (B, E)
    with torch.no_grad():  # which experts: group-limited top-k on the scores plus the correction bias
        choice = scores + router.e_score_correction_bias.to(x.dtype)
        G = int(router.num_group)
        grouped = choice.reshape(x.shape[0], G, -1)
        best = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(-1)  # (B, G)
        keep = torch.zeros_like(best).scatter(1, best.topk(int(router.topk_group), dim=-1)[1], 1.0)
        choice = choice.masked_fill(~keep.bool().repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
        index = choice.topk(int(router.top_k), dim=-1)[1]  # (B, k)
    weights = scores.gather(1, index)
    if router.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    weights = weights * router.routed_scaling_factor
    latent = moe.fc1_latent_proj(x)
    act = torch.relu(torch.einsum("bkid,bd->bki", experts.up_proj[index], latent)) ** 2
    routed = torch.einsum("bkdi,bki,bk->bd", experts.down_proj[index], act, weights)
    return moe.fc2_latent_proj(routed) + relu2_mlp(moe.shared_experts, x)


class HFNemotronHCore(Mamba2HybridCore):
    """gradscope core over a transformers ``NemotronHModel`` (held by reference)."""

    name = "hf-nemotron-h"
    label = "Nemotron-H (transformers)"
    family = "Nemotron-H"

    def __init__(self, backbone: nn.Module, positions: int = POSITIONS) -> None:
        cfg = backbone.config
        self.positions = check_positions(positions)
        self.types = tuple(str(b.block_type) for b in backbone.layers)
        unknown = sorted(set(self.types) - set(KINDS))
        check(not unknown, f"model: Nemotron-H block types {unknown} are not built (the adapter knows "
                           f"{', '.join(KINDS)})")
        check(str(cfg.mlp_hidden_act) == "relu2" or not {"mlp", "moe"} & set(self.types),
              f"model: mlp_hidden_act={cfg.mlp_hidden_act!r}; the adapter knows Nemotron-H's relu²")
        mamba = [b.mixer for b, k in zip(backbone.layers, self.types) if k == "linear_attention"]
        check(bool(mamba), "model: a Nemotron-H without Mamba blocks; it has no recurrent state")
        self._mixer_dims(mamba[0], cfg)
        self.Hq, self.Hkv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.Hq)
        entries = []
        for i, kind in enumerate(self.types):
            if kind == "linear_attention":
                entries += self._entries(i)
            elif kind == "full_attention":
                entries += cache_entries(i, self.positions, self.Hkv, self.hd)
        LibraryCore.__init__(self, backbone, entries, int(cfg.hidden_size))
        self.num_layers = len(self.types)


    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B, d = x.shape[0], self.hd
        parts = self.unpack(z)
        new, diag = {}, {}
        h = x
        for i, block in enumerate(self.model.layers):
            kind = self.types[i]
            if kind == "linear_attention":
                h = self._advance_layer(i, block, h, parts, new, diag if diagonal else None)
                continue
            hn = rms(h, block.norm.variance_epsilon) * block.norm.weight
            a = block.mixer
            if kind == "full_attention":
                step = check_position(t, self.positions, self.family)
                out, keys, values = attention_step(a, hn, parts[f"l{i}/keys"], parts[f"l{i}/values"], step, self.Hq,
                                                   self.Hkv, d)
                new[f"l{i}/keys"], new[f"l{i}/values"] = keys, values
                h = h + out
                if diagonal:
                    for part in ("keys", "values"):
                        diag[f"l{i}/{part}"] = cache_diagonal(B, self.positions, self.Hkv * d, step, x)
            elif kind == "moe":
                h = h + moe_step(a, hn)
            else:  # a stateless MLP block: relu²
                h = h + relu2_mlp(a, hn)
        f = self.model.norm_f
        y = rms(h, f.variance_epsilon) * f.weight
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []


def adapt(model: nn.Module, positions: int = POSITIONS) -> Adapted:
    """The adapter of a ``NemotronHForCausalLM``/``NemotronHModel``, with ``positions`` attention cache slots."""
    backbone = getattr(model, "model", getattr(model, "backbone", model))
    check(hasattr(backbone, "layers") and hasattr(backbone, "norm_f") and hasattr(backbone, "embeddings"),
          f"model: {type(model).__name__} has no Nemotron-H backbone (embeddings, layers, norm_f)")
    return Adapted(HFNemotronHCore(backbone, positions), TokenMap(backbone.embeddings),
                   getattr(model, "lm_head", None), hf_forward(model), TOLERANCE)


__all__ = ["HFNemotronHCore", "TOLERANCE", "adapt"]
