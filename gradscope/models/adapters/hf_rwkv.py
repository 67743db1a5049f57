"""transformers' RWKV (``RwkvForCausalLM``, ``RwkvModel``; RWKV-4) as a gradscope core.

One step per layer l, as transformers' ``RwkvBlock`` computes it on its CPU path
(``rwkv_linear_attention_cpu``), in the model's dtype, batched correctly (transformers' own one-token
path broadcasts (B, H) against (B, 1, H) and mixes sequences for B > 1; this adapter does not)::

    a = LN1(h);  k, v, r = K(mix_k(a, a_prev)), V(mix_v(a, a_prev)), σ(R(mix_r(a, a_prev)))
    wkv = (e^{m−μ} n + e^{k+u−μ} v) / (e^{m−μ} d + e^{k+u−μ}),   μ = max(m, k + u)
    m' = max(m + w, k);  n' = e^{m+w−m'} n + e^{k−m'} v;  d' = e^{m+w−m'} d + e^{k−m'}
    h += O(r ⊙ wkv);  b = LN2(h);  h += σ(R_f(mix(b, b_prev))) ⊙ V_f(relu(K_f(mix(b, b_prev)))²)

with w = −exp(time_decay), u = time_first, mix_k(a, s) = a ⊙ μ_k + s ⊙ (1 − μ_k).

Coordinates: the library's own (numerator n, denominator d, running maximum m), m starting at −1e30
as in ``RwkvModel`` (so :meth:`HFRwkvCore.init_state` is not zero). State layout, layer 0 first:
``l<i>/att_shift`` (H): the layer's last attention input a_prev; ``l<i>/max`` (A), ``l<i>/num`` (A),
``l<i>/den`` (A); ``l<i>/ffn_shift`` (H): the last feed-forward input b_prev. Every entry is read.

Structure: every block is diagonal. The shift entries are overwritten each step (J's own block is
zero: exponents −∞); ∂m'/∂m is 1 where m + w wins the maximum and 0 where the key does; ∂n'/∂n =
∂d'/∂d = e^{m+w−m'}; each entry reads only earlier entries (m before n, d; all before ffn_shift),
and layer l reads layers < l, so J_t is lower-triangular over the blocks. In these coordinates the
stabiliser m carries part of the dynamics (see docs/models-from-libraries.md).

Output y_t: ``ln_out`` of the residual stream (the model's last hidden state); readout: ``head``.
With ``rescale_every > 0`` transformers halves the stream every ``rescale_every`` layers once its
weights are rescaled (eval mode, after a forward); the adapter follows ``layers_are_rescaled``.

Wrap-time check: logits within 1e-4 of the library's full-sequence forward (relative to their largest
magnitude, at least 1); the library keeps n, d, m and the keys in float32 even in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import check
from gradscope.models.adapters.base import Adapted, Entry, LibraryCore, TokenMap, hf_forward

TOLERANCE = 1e-4
MAX_START = -1e30  # RwkvModel's initial running maximum


def _ln(module: nn.LayerNorm, x: Tensor) -> Tensor:
    return F.layer_norm(x, module.normalized_shape, module.weight, module.bias, module.eps)


class HFRwkvCore(LibraryCore):
    """gradscope core over a transformers ``RwkvModel`` (held by reference)."""

    name = "hf-rwkv"
    label = "RWKV (transformers)"
    library = "transformers"
    family = "RWKV"

    def __init__(self, rwkv: nn.Module) -> None:
        cfg = rwkv.config
        self.H = int(cfg.hidden_size)
        self.A = int(rwkv.blocks[0].attention.attention_hidden_size)
        entries = []
        for i in range(len(rwkv.blocks)):
            entries += [Entry(f"l{i}/att_shift", (self.H,), "diagonal"), Entry(f"l{i}/max", (self.A,), "diagonal"),
                        Entry(f"l{i}/num", (self.A,), "diagonal"), Entry(f"l{i}/den", (self.A,), "diagonal"),
                        Entry(f"l{i}/ffn_shift", (self.H,), "diagonal")]
        super().__init__(rwkv, entries, self.H)
        self.num_layers = len(rwkv.blocks)

    def init_state(self, batch: int, like: Tensor) -> Tensor:
        """Zero shifts, numerators and denominators; running maxima at −1e30 (``RwkvModel``'s start)."""
        z = like.new_zeros(batch, self.state_dim)
        for i in range(self.num_layers):
            z[:, self._slices[f"l{i}/max"]] = MAX_START
        return z

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        rwkv = self.model
        parts = self.unpack(z)
        new, diag = {}, {}
        every = int(getattr(rwkv.config, "rescale_every", 0) or 0)
        h = x
        for i, block in enumerate(rwkv.blocks):
            if i == 0:
                h = _ln(block.pre_ln, h)
            att = block.attention
            a = _ln(block.ln1, h)
            prev = parts[f"l{i}/att_shift"]

            def mix(mu: Tensor, cur: Tensor = a, old: Tensor = prev) -> Tensor:
                mu = mu.reshape(-1)
                return cur * mu + old * (1 - mu)

            k, v = att.key(mix(att.time_mix_key)), att.value(mix(att.time_mix_value))
            r = torch.sigmoid(att.receptance(mix(att.time_mix_receptance)))
            m, n, d = parts[f"l{i}/max"], parts[f"l{i}/num"], parts[f"l{i}/den"]
            w, u = -torch.exp(att.time_decay), att.time_first
            mu_out = torch.maximum(m, k + u)
            e1, e2 = torch.exp(m - mu_out), torch.exp(k + u - mu_out)
            wkv = (e1 * n + e2 * v) / (e1 * d + e2)
            decayed = m + w
            m_new = torch.maximum(decayed, k)
            f1, f2 = torch.exp(decayed - m_new), torch.exp(k - m_new)
            new[f"l{i}/max"], new[f"l{i}/num"], new[f"l{i}/den"] = m_new, f1 * n + f2 * v, f1 * d + f2
            h = h + att.output(r * wkv)
            ffn = block.feed_forward
            b = _ln(block.ln2, h)
            fprev = parts[f"l{i}/ffn_shift"]
            key = torch.square(torch.relu(ffn.key(mix(ffn.time_mix_key, b, fprev))))
            h = h + torch.sigmoid(ffn.receptance(mix(ffn.time_mix_receptance, b, fprev))) * ffn.value(key)
            new[f"l{i}/att_shift"], new[f"l{i}/ffn_shift"] = a, b
            if rwkv.layers_are_rescaled and every > 0 and (i + 1) % every == 0:
                h = h / 2
            if diagonal:
                zero = x.new_zeros(x.shape[0], self.H)
                wins = (decayed > k).to(x.dtype) + 0.5 * (decayed == k).to(x.dtype)  # torch.maximum's derivative
                diag.update({f"l{i}/att_shift": zero, f"l{i}/max": wins, f"l{i}/num": f1, f"l{i}/den": f1,
                             f"l{i}/ffn_shift": zero})
        y = _ln(rwkv.ln_out, h)
        return y, self.pack(new), self.flat_blocks(diag) if diagonal else []


def adapt(model: nn.Module) -> Adapted:
    """The adapter of a ``RwkvForCausalLM``/``RwkvModel``."""
    rwkv = getattr(model, "rwkv", model)
    check(hasattr(rwkv, "blocks") and hasattr(rwkv, "ln_out"), f"model: {type(model).__name__} has no RWKV backbone")
    return Adapted(HFRwkvCore(rwkv), TokenMap(rwkv.embeddings), getattr(model, "head", None), hf_forward(model),
                   TOLERANCE)


__all__ = ["HFRwkvCore", "TOLERANCE", "adapt"]
