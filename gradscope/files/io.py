"""Atomic file writes and safe checkpoint reads.

Every write goes to a temporary file in the destination's directory, is fsynced, then renamed
over the destination (``os.replace`` is atomic on POSIX), so a killed run never leaves a
half-written file. Every read uses ``torch.load(weights_only=True)`` explicitly: an environment
variable can flip torch's default back to unsafe unpickling.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from gradscope.errors import GradscopeError
from gradscope.guard import check_bytes
from gradscope.files.publish import OUT_LABEL, WRITE_ERRORS, disk_error, publish, remove_stale_temporaries, temp_path


def sha256_file(path: Path) -> str:
    """The sha256 hex digest of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_write(path: Path, write: Callable[[Path], None], *, overwrite: bool = True, what: str = OUT_LABEL) -> None:
    """Call ``write(tmp)`` on a temporary sibling of ``path``, fsync it, then rename it to ``path``.

    The temporary is named after this process (:func:`gradscope.guard.temp_path`), so the next run
    removes it if this one is killed. Without ``overwrite`` an existing ``path`` is never replaced,
    even one that another process wrote meanwhile. A full disk, a file-size limit or a missing
    permission is a one-line user error, and leaves ``path`` as it was.
    """
    path = Path(path)
    remove_stale_temporaries(path.parent, path.name)
    if not overwrite and (path.exists() or path.is_symlink()):
        raise GradscopeError(f"{what}: {path} already exists; choose another path or pass overwrite=True (--overwrite)")
    tmp = temp_path(path)
    try:
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)  # the umask applies, as for any new file
        os.close(fd)
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        publish(tmp, path, overwrite=overwrite, what=what)
    except OSError as exc:
        if exc.errno in WRITE_ERRORS:
            raise disk_error(exc, path, what) from None
        raise
    except RuntimeError as exc:  # torch.save reports a failed write as a RuntimeError
        cause = _disk_cause(exc)
        if cause is not None:
            raise disk_error(cause, path, what) from None
        if "write" in str(exc).lower() or "file" in str(exc).lower():
            raise GradscopeError(f"{what}: cannot write {path} ({str(exc).splitlines()[0][:120]}); "
                                 f"nothing was written") from None
        raise
    finally:
        tmp.unlink(missing_ok=True)


def _disk_cause(exc: BaseException | None) -> OSError | None:
    """The full-disk (or file-size limit, or permission) error behind ``exc``, if any: torch.save
    reports the OSError of the file object it writes to as the context of a RuntimeError."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in WRITE_ERRORS:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _torch_save(obj: Any, path: Path) -> None:
    # through a Python file object, so that a failed write keeps its OSError (errno) as the context
    with open(path, "wb") as fh:
        torch.save(obj, fh)


def atomic_write_text(path: Path, text: str, *, what: str = OUT_LABEL) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text), what=what)


def atomic_save(obj: Any, path: Path, *, what: str = OUT_LABEL) -> None:
    """``torch.save`` to ``path`` atomically."""
    atomic_write(path, lambda tmp: _torch_save(obj, tmp), what=what)


def safe_load(path: Path) -> Any:
    """Load a torch file with ``weights_only=True`` on the CPU; user-facing errors for bad files."""
    path = Path(path)
    if not path.is_file():
        raise GradscopeError(f"checkpoint: {path} does not exist or is not a file")
    check_bytes(path.stat().st_size, f"checkpoint: {path}")  # torch.load reads the whole file into memory
    try:
        with warnings.catch_warnings():
            # torch warns before refusing a TorchScript archive; the refusal below says it in one line
            warnings.filterwarnings("ignore", message=".*TorchScript archive.*")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if "Unsupported" in ln or "WeightsUnpickler" in ln]
        reason = (lines[0] if lines else type(exc).__name__).replace("WeightsUnpickler error: ", "")
        raise GradscopeError(
            f"checkpoint: refused to load {path}: it holds objects that are not plain data, "
            f"which could run code ({reason[:160]})") from None
    except Exception as exc:  # noqa: BLE001 - any failure to parse a user file is a user error
        if "TorchScript" in str(exc):
            raise GradscopeError(f"checkpoint: {path} is a TorchScript archive (torch.jit.save), not a checkpoint; "
                                 f"load it with torch.jit.load and pass the model through gradscope.wrap") from None
        raise GradscopeError(
            f"checkpoint: cannot read {path}: not a torch checkpoint, or truncated "
            f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ''})") from None
