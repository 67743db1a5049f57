"""Device selection: the one place where a device name from an option or a config is parsed."""

from __future__ import annotations

import torch

from gradscope.errors import GradscopeError

ACCELERATORS = ("cuda", "mps", "xpu")  # device types with a torch.<type>.is_available() / device_count()
VALID = "auto, cpu, cuda or cuda:N"


def resolve_device(name: str) -> torch.device:
    """'auto' → cuda when available, else cpu. Anything else must name a device this machine can
    compute on: cpu, or an available cuda/mps/xpu device (meta and other virtual devices are refused)."""
    if not isinstance(name, str):
        raise GradscopeError(f"device: got {type(name).__name__}; use {VALID}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise GradscopeError(f"device: got {name!r}; use {VALID}") from None
    if device.type == "cpu":
        return device
    if device.type not in ACCELERATORS:
        raise GradscopeError(f"device: got {name!r}, a {device.type} device that cannot run computations here; "
                             f"use {VALID}")
    backend = getattr(torch, device.type, None)
    available = getattr(backend, "is_available", None)
    if not callable(available) or not available():
        raise GradscopeError(f"device: got {name!r}, but no {device.type.upper()} device is available; use auto or cpu")
    count = getattr(backend, "device_count", lambda: 1)()
    if device.index is not None and device.index >= count:
        raise GradscopeError(f"device: got {name!r}, but this machine has {count} {device.type} device(s) "
                             f"(indices 0..{count - 1})")
    return device
