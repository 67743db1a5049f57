"""Device selection."""

from __future__ import annotations

import torch

from gradscope.errors import GradscopeError


def resolve_device(name: str) -> torch.device:
    """'auto' → cuda when available, else cpu. Anything else must name an available device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise GradscopeError(f"device: got {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise GradscopeError(f"device: got {name!r}, but no CUDA device is available; use auto or cpu")
    return device
