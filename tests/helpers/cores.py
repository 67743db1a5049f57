"""The one tiny-model helper for tests that loop over the core registry: every registered core is
built the same way, from its own ``tiny_config``, and no test branches on a core's name."""

from __future__ import annotations

import torch

from gradscope.config import ModelConfig
from gradscope.fields import from_dict
from gradscope.models import CORES, Core, SeqModel


def tiny_core(name: str, input_size: int, hidden: int, layers: int = 1, *, seed: int = 0,
              gain: float = 3.0) -> Core:
    """A float64 core of the registry from its ``tiny_config``; its recurrent weight blocks
    (``recurrent_blocks()``, views of the weights) scaled by ``gain``, so that products of step
    Jacobians over a few steps stay far from 0 (default-initialised RNNs give ~1e-13)."""
    cls = CORES[name]
    torch.manual_seed(seed)
    core = cls.build(input_size, hidden, layers, from_dict(cls.Config, dict(cls.tiny_config))).double()
    with torch.no_grad():
        for block in core.recurrent_blocks().values():
            block.mul_(gain)
    return core


def tiny_config(name: str, vocab: int, embed: int, hidden: int, layers: int = 1, pe: str = "none",
                max_len: int = 16, combine: str = "concat") -> ModelConfig:
    """A model config of the registered core ``name`` at test size, its own settings its ``tiny_config``."""
    return ModelConfig(core=name, vocab_size=vocab, embed_size=embed, hidden_size=hidden, num_layers=layers,
                       pe=pe, pe_combine=combine, max_len=max_len, core_config=dict(CORES[name].tiny_config))


def tiny_model(name: str, vocab: int, embed: int, hidden: int, layers: int = 1, pe: str = "none", *,
               seed: int = 0, gain: float = 3.0, max_len: int = 16) -> SeqModel:
    """A float64 :class:`SeqModel` around :func:`tiny_core`'s core (same seed, same scaling)."""
    torch.manual_seed(seed)
    model = SeqModel(tiny_config(name, vocab, embed, hidden, layers, pe, max_len)).double()
    with torch.no_grad():
        for block in model.core.recurrent_blocks().values():
            block.mul_(gain)
    return model


def rolled_jacobian(step, x: torch.Tensor, z_start: torch.Tensor, start: int, output) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Brute force ∂output/∂z_start (B, H, D): roll ``step(x_t, z) → (out, z')`` from ``z_start`` over
    x[:, start:], then one autograd.grad per row of ``output(out, z_T)`` (sequences are independent)."""
    z0 = z_start.clone().requires_grad_(True)
    out, z = None, z0
    for t in range(start, x.shape[1]):
        out, z = step(x[:, t], z)
    y = output(out, z)
    return torch.stack([torch.autograd.grad(y[:, i].sum(), z0, retain_graph=True)[0] for i in range(y.shape[1])], dim=1)
