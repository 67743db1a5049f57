"""Atomic file writes and safe checkpoint reads.

Every write goes to a temporary file in the destination's directory, is fsynced, then renamed
over the destination (``os.replace`` is atomic on POSIX), so a killed run never leaves a
half-written file. Every read uses ``torch.load(weights_only=True)`` explicitly: an environment
variable can flip torch's default back to unsafe unpickling.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from gradscope.errors import GradscopeError


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary sibling of ``path``, fsync it, then rename it to ``path``."""
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path`` atomically."""
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def safe_load(path: Path) -> Any:
    """Load a torch file with ``weights_only=True`` on the CPU; user-facing errors for bad files."""
    path = Path(path)
    if not path.is_file():
        raise GradscopeError(f"checkpoint: {path} does not exist or is not a file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if "Unsupported" in ln or "WeightsUnpickler" in ln]
        reason = (lines[0] if lines else type(exc).__name__).replace("WeightsUnpickler error: ", "")
        raise GradscopeError(
            f"checkpoint: refused to load {path}: it holds objects that are not plain data, "
            f"which could run code ({reason[:160]})") from None
    except Exception as exc:  # noqa: BLE001 - any failure to parse a user file is a user error
        raise GradscopeError(
            f"checkpoint: cannot read {path}: not a torch checkpoint, or truncated "
            f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ''})") from None
