"""transformers' Bamba (``BambaForCausalLM``, ``BambaModel``): Mamba-2 layers and attention layers, each followed
by a SwiGLU MLP, as a gradscope core.

One step per decoder layer, in the model's dtype::

    ĥ = RMSNorm(h)                                   # w · x / rms(x)
    Mamba-2 layer: the SSD step of :mod:`~gradscope.models.adapters.hf_mamba2` on ĥ (conv window, per-head
        matrix state S' = exp(Δ_h A_h) S + Δ_h x ⊗ B, grouped gated norm)
    attention layer: q, k, v = q_proj ĥ, k_proj ĥ, v_proj ĥ; rope(q, k, t) (partial); slot t of the cache
        ← (k, v); o = softmax(q Kᵀ/√d) V over slots ≤ t; out = o_proj(o)
    h += out;  h += down(silu(gate ĥ') ⊙ up ĥ')     # ĥ' = pre_ff_layernorm(h)

State layout, layer 0 first: a Mamba-2 layer has ``l<i>/conv`` and ``l<i>/ssm`` as in the Mamba-2 adapter; an
attention layer ``l<i>/keys``, ``l<i>/values`` (positions, KV heads, head dim), held
(:mod:`~gradscope.models.adapters.attention`). The step is position-dependent. Its Jacobian products are
``torch.func``'s (the Mamba-2 adapter's hand-derived products assume every layer is Mamba-2).

Output y_t: ``final_layernorm`` of the residual stream; readout: ``lm_head`` for ``BambaForCausalLM``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.attention import POSITIONS, attend, check_position, held_blocks, rope, rotary, write_slot
from gradscope.models.adapters.base import Adapted, Entry, LibraryCore, TokenMap, hf_forward, rms, shift_blocks
from gradscope.models.adapters.hf_mamba2 import SILU, HFMamba2Core
from gradscope.models.adapters.hf_qwen3_next import swiglu

TOLERANCE = 1e-4


def _norm(module: nn.Module, x: Tensor) -> Tensor:
    return rms(x, module.variance_epsilon) * module.weight


class HFBambaCore(HFMamba2Core):
    """gradscope core over a transformers ``BambaModel`` (held by reference): the Mamba-2 adapter's SSD step on
    its Mamba layers, attention with its keys and values as state on the others."""

    name = "hf-bamba"
    label = "Bamba (transformers)"
    family = "Bamba"
    position_dependent = True
    own_cost: dict[str, float] = {}
    # the Mamba-2 adapter's own products walk every layer as Mamba-2: the generic torch.func ones here
    step_tangents = step_cotangents = chain_tangents = span_cotangents = None  # type: ignore[assignment]

    def __init__(self, backbone: nn.Module, positions: int = POSITIONS) -> None:  # noqa: PLR0915 - one adapter's checks
        cfg = backbone.config
        check(isinstance(positions, int) and positions >= 1, f"positions: got {positions!r}; expected a positive "
                                                              f"number of attention cache slots")
        self.types = tuple(cfg.layers_block_type[:cfg.num_hidden_layers])
        unknown = sorted(set(self.types) - {"linear_attention", "full_attention"})
        check(not unknown, f"model: layer types {unknown} are not ones the Bamba adapter knows")
        mamba = [layer.mamba for layer in backbone.layers if hasattr(layer, "mamba")]
        check(bool(mamba), "model: a Bamba without Mamba layers; wrap it as the transformer it is")
        m = mamba[0]
        self.I, self.N, self.K = int(m.intermediate_size), int(m.ssm_state_size), int(m.conv_kernel_size)
        self.H, self.P, self.G, self.C = int(m.num_heads), int(m.head_dim), int(m.n_groups), int(m.conv_dim)
        check(self.K >= 2, f"model: mamba_d_conv={self.K}; the adapter needs a causal conv of width >= 2")
        check(self.H * self.P == self.I and self.H % self.G == 0,
              f"model: {self.H} heads of {self.P} in {self.G} groups do not tile the inner width {self.I}")
        check(m.in_proj.out_features == self.I + self.C + self.H,
              f"model: in_proj gives {m.in_proj.out_features} features, not gate + conv + heads")
        check(str(cfg.hidden_act) in SILU, f"model: hidden_act={cfg.hidden_act!r}; the adapter knows Bamba with SiLU")
        attn = next((layer.self_attn for layer in backbone.layers if hasattr(layer, "self_attn")), None)
        self.Hq = int(cfg.num_attention_heads)
        self.Hkv = int(cfg.num_key_value_heads)
        self.hd = int(attn.head_dim) if attn is not None else int(cfg.hidden_size // self.Hq)
        self.positions = int(positions)
        entries = []
        for i, kind in enumerate(self.types):
            if kind == "linear_attention":
                entries += [Entry(f"l{i}/conv", (self.C, self.K - 1), "block_diagonal", self.K - 1),
                            Entry(f"l{i}/ssm", (self.H, self.P, self.N), "diagonal", self.P * self.N)]
            else:
                entries += [Entry(f"l{i}/{part}", (self.positions, self.Hkv, self.hd), "diagonal", held=True)
                            for part in ("keys", "values")]
        LibraryCore.__init__(self, backbone, entries, int(cfg.hidden_size))
        self.num_layers = len(self.types)
        limit = tuple(float(v) for v in getattr(cfg, "time_step_limit", (0.0, float("inf"))))
        self.limit = None if limit == (0.0, float("inf")) else limit

    def with_positions(self, positions: int) -> "HFBambaCore":
        """The same model's core with ``positions`` attention cache slots (the library model by reference)."""
        return type(self)(self.model, positions)

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        B, d = x.shape[0], self.hd
        parts = self.unpack(z)
        new, diag = {}, {}
        h = x
        for i, layer in enumerate(self.model.layers[:self.num_layers]):
            if self.types[i] == "linear_attention":
                window = parts[f"l{i}/conv"]
                L = self._layer(SimpleNamespace(norm=layer.input_layernorm, mixer=layer.mamba), h, window,
                                parts[f"l{i}/ssm"])
                h = h + L.res
                new[f"l{i}/conv"] = torch.cat([window[..., 1:], L.xbc[..., None]], dim=-1)
                new[f"l{i}/ssm"] = L.s
                if diagonal:
                    diag[f"l{i}/conv"] = shift_blocks(B, self.C, self.K - 1, x)
                    diag[f"l{i}/ssm"] = L.a[..., None, None].expand(B, self.H, self.P, self.N)
            else:
                a = layer.self_attn
                step = check_position(t, self.positions, self.family)
                hn = _norm(layer.input_layernorm, h)
                cos, sin = rotary(self.model.rotary_emb, hn, step)
                q = rope(a.q_proj(hn).reshape(B, self.Hq, d), cos, sin)
                k = rope(a.k_proj(hn).reshape(B, self.Hkv, d), cos, sin)
                keys = write_slot(parts[f"l{i}/keys"], k, step)
                values = write_slot(parts[f"l{i}/values"], a.v_proj(hn).reshape(B, self.Hkv, d), step)
                new[f"l{i}/keys"], new[f"l{i}/values"] = keys, values
                h = h + a.o_proj(attend(q, keys, values, step, a.scaling).reshape(B, self.Hq * d))
                if diagonal:
                    for part in ("keys", "values"):
                        diag[f"l{i}/{part}"] = held_blocks(B, self.positions, self.Hkv * d, step, x)
            h = h + swiglu(layer.feed_forward, _norm(layer.pre_ff_layernorm, h))
        y = _norm(self.model.final_layernorm, h)
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []


def adapt(model: nn.Module, positions: int = POSITIONS) -> Adapted:
    """The adapter of a ``BambaForCausalLM``/``BambaModel``, with ``positions`` attention cache slots."""
    backbone = getattr(model, "model", model)
    check(hasattr(backbone, "layers") and hasattr(backbone, "embed_tokens"),
          f"model: {type(model).__name__} has no Bamba backbone (embed_tokens, layers)")
    return Adapted(HFBambaCore(backbone, positions), TokenMap(backbone.embed_tokens),
                   getattr(model, "lm_head", None), hf_forward(model), TOLERANCE)


__all__ = ["HFBambaCore", "TOLERANCE", "adapt"]
