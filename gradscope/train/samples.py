"""Shipped sample checkpoints (sample_checkpoints/): a checkpoint that keeps everything analysis needs
(configs, weights, held-out data, iteration) but drops the optimizer state, which would double its size, and
stores held-out token ids as int16; it is marked ``"stripped": True`` and cannot be resumed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gradscope.errors import check
from gradscope.files.checkpoint import validate_checkpoint
from gradscope.files.io import atomic_save, safe_load


def _narrow(t: torch.Tensor | None) -> torch.Tensor | None:
    """Token ids as int16 when they fit (they do for K < 32767): a quarter of the int64 size."""
    if t is None or t.numel() == 0 or int(t.max()) >= 2**15 or int(t.min()) < -(2**15):
        return t
    return t.to(torch.int16)


def strip_checkpoint(src: Path, dst: Path) -> None:
    """Copy a gradscope checkpoint without its optimizer state, held-out ids narrowed (atomically)."""
    ckpt = safe_load(src)
    _, source = validate_checkpoint(ckpt, src)
    check(source == "gradscope", f"sample: {src} is not a gradscope checkpoint")
    ckpt["optimizer"] = {}
    ckpt["stripped"] = True
    ckpt["heldout"] = {k: _narrow(v) for k, v in ckpt["heldout"].items()}
    atomic_save(ckpt, dst)
