"""A third-party recurrent model through gradscope's core protocol: mambapy's pure-PyTorch Mamba.

``MambaCore(mamba)`` adapts a ``mambapy.mamba.Mamba`` (https://github.com/alxndrTL/mamba.py,
``pip install mambapy``) to the protocol of :mod:`gradscope.models.core`, so gradscope's generic
engines ("vjp", "func") give its state Jacobians::

    from mambapy.mamba import Mamba, MambaConfig
    import gradscope

    mamba = Mamba(MambaConfig(d_model=8, n_layers=2, d_state=4, d_conv=3)).double().eval()
    model = gradscope.wrap(MambaCore(mamba))                   # float inputs (B, T, d_model)
    res = gradscope.state_jacobian(model, x, p, method="vjp")  # p < T; res.jac (B, d_model, state_dim)

This is an adapter, not a reimplementation: it keeps a reference to the ``Mamba`` module (no weight
copies) and runs mambapy's own recurrent ``Mamba.step(x, caches)`` (one token per call) — the same
code mambapy's ``LM.generate`` uses. It only converts between gradscope's flat real state z and
mambapy's per-layer caches.

State layout. mambapy keeps, per layer l, a cache ``(h_l, inputs_l)``:

- ``h_l`` (B, ED, N): the selective-SSM state (ED = expand_factor · d_model channels, N = d_state);
- ``inputs_l`` (B, ED, d_conv − 1): the last d_conv − 1 inputs of the layer's causal depthwise
  conv1d (the in_proj x-branch before the conv), oldest first.

z is every layer's cache, layer 1 first, each flattened row-major (C order):
``z = [h_1 (ED·N), conv_1 (ED·(d_conv−1)), h_2, conv_2, …]``, so
``state_dim = n_layers · ED · (N + d_conv − 1)``; :meth:`MambaCore.state_layout` names the slices.
The output y_t is the Mamba stack's output at step t (the residual stream after the last layer,
width d_model; ``Mamba`` has no final norm or LM head — put them in ``gradscope.wrap(...,
readout=...)`` if wanted). The state starts at zero, as in mambapy (its zero ``h`` and zero conv
cache equal the parallel forward's zero padding).

What z_p means here: the full cache right after token p is read, i.e. every layer's SSM state h_p
and its conv window holding the layer inputs of tokens p − d_conv + 2 … p. J = ∂y_T/∂z_p then
says how the output at T responds to that cache, tokens p+1 … T held fixed. The conv columns do not
vanish when T − p is large: the window feeds the conv outputs of steps p+1 … p+d_conv−1, hence the
SSM states written then, which persist.

No ``readout(x, z)``: Mamba's y_t is not a function of (z_t, x_t). The conv output at t reads d_conv
inputs (x_{t−d_conv+1} … x_t), but the cache after step t keeps only the last d_conv − 1 of them, so
the oldest one, and with it y_t, cannot be recovered. Jacobians are therefore available for p < T
(gradscope raises a clear error at p = T).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class MambaCore(nn.Module):
    """gradscope core protocol around a ``mambapy.mamba.Mamba`` (held by reference, run by its own ``step``)."""

    name = "mambapy"
    label = "Mamba (mambapy)"
    complex_state = False

    def __init__(self, mamba: nn.Module) -> None:
        super().__init__()
        self.mamba = mamba
        cfg = mamba.config
        self.n_layers = int(cfg.n_layers)
        self.num_layers = self.n_layers  # what gradscope.wrap(...).describe() records
        self.d_inner = int(cfg.d_inner)  # ED
        self.d_state = int(cfg.d_state)  # N
        self.d_window = int(cfg.d_conv) - 1  # conv cache length
        self.h_dim = self.d_inner * self.d_state
        self.conv_dim = self.d_inner * self.d_window
        self.state_dim = self.n_layers * (self.h_dim + self.conv_dim)
        self.out_dim = int(cfg.d_model)

    def to_caches(self, z: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Flat z (B, state_dim) → mambapy's caches: [(h (B, ED, N), inputs (B, ED, d_conv − 1)) per layer]."""
        B = z.shape[0]
        parts = z.split([self.h_dim, self.conv_dim] * self.n_layers, dim=1)
        return [(parts[2 * i].reshape(B, self.d_inner, self.d_state),
                 parts[2 * i + 1].reshape(B, self.d_inner, self.d_window)) for i in range(self.n_layers)]

    def from_caches(self, caches: list[tuple[Tensor, Tensor]]) -> Tensor:
        """mambapy's caches → flat z (B, state_dim) (the inverse of :meth:`to_caches`)."""
        return torch.cat([t.reshape(t.shape[0], -1) for cache in caches for t in cache], dim=1)

    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """One token through mambapy's ``Mamba.step``: x (B, d_model), z (B, state_dim) → (y (B, d_model), z')."""
        y, caches = self.mamba.step(x, self.to_caches(z))  # mambapy overwrites the list's entries: a fresh list each call
        return y, self.from_caches(caches)

    def state_layout(self) -> dict[str, slice]:
        """Named slices of z: ``h1``, ``conv1``, ``h2``, ``conv2`` …"""
        layout, start = {}, 0
        for i in range(1, self.n_layers + 1):
            for key, width in (("h", self.h_dim), ("conv", self.conv_dim)):
                layout[f"{key}{i}"] = slice(start, start + width)
                start += width
        return layout

    def init_state(self, batch: int, like: Tensor) -> Tensor:
        """The zero state (B, state_dim): mambapy's initial cache (h = 0, zero conv window)."""
        return like.new_zeros(batch, self.state_dim)
