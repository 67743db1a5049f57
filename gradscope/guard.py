"""The validation layer's shared checks (issue #15), used at every boundary where outside data comes in.

- **Sizes:** :func:`check_bytes` compares what a file or an option implies against the memory this
  machine has available (and, given the bytes actually present, against a plausible compression
  ratio), *before* anything is allocated.
- **Values:** :func:`as_int` takes an integer from a file or an option (no bool, str, NaN, 1e30);
  :func:`check_tensor` accepts only a dense, strided, CPU tensor whose storage really holds its
  elements (no sparse, meta or stride-0 bomb).
- **Paths:** :func:`safe_component` and :func:`inside` keep a path built from a spec, a store or a
  manifest inside its root.
- **Temporaries and publication:** :func:`temp_path` names a temporary sibling after its owner's
  pid, so :func:`remove_stale_temporaries` can remove the leftovers of a killed run (and never a
  live writer's); :func:`publish` renames it into place, either atomically replacing or refusing to
  replace (``renameat2(RENAME_NOREPLACE)``, or ``link`` for files), so that of two concurrent
  writers without ``overwrite`` exactly one succeeds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import math
import os
import re
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any

import torch

from gradscope.errors import GradscopeError

MEMORY_FRACTION = 0.5  # of the memory available now: the most one allocation may claim
MAX_RATIO = 1000.0  # declared bytes per byte present above which a large input is a decompression bomb
SMALL = 64 << 20  # inputs below this size are never refused for their compression ratio
GiB = 1 << 30


def available_memory() -> int:
    """Bytes of memory available now (``MemAvailable``; the physical total where that is unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * GiB


def memory_budget() -> int:
    """The most bytes one input or option may make gradscope allocate (``GRADSCOPE_MEMORY_BUDGET``
    in bytes overrides it, e.g. for a machine shared with other jobs)."""
    env = os.environ.get("GRADSCOPE_MEMORY_BUDGET", "")
    if env.strip().isdigit():
        return int(env)
    return int(available_memory() * MEMORY_FRACTION)


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def check_bytes(nbytes: float, what: str, *, present: float | None = None) -> None:
    """Refuse ``what`` if it would need ``nbytes`` of memory beyond the budget, or (given the bytes
    actually ``present`` in the file) if it expands more than :data:`MAX_RATIO`-fold."""
    nbytes = float(nbytes) if nbytes < 1e300 else math.inf  # a Python int may exceed any float
    if not math.isfinite(nbytes) or nbytes > memory_budget():
        raise GradscopeError(f"{what}: needs {_size(nbytes)} of memory; {_size(memory_budget())} is available "
                             f"to one allocation on this machine")
    if present is not None and nbytes > SMALL and nbytes > MAX_RATIO * max(present, 1.0):
        raise GradscopeError(f"{what}: declares {_size(nbytes)} from {_size(present)} on disk; refusing a "
                             f"decompression bomb")


def as_int(value: Any, what: str, low: int | None = None, high: int | None = None) -> int:
    """An integer from outside (a file field or an option): an int, an integral float or a 0-d
    integer tensor, within [low, high]. Anything else (bool, str, NaN, 1e30) is a user error."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_meta and value.layout == torch.strided:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GradscopeError(f"{what}: got {type(value).__name__} {str(value)[:40]!r}; expected an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value) or abs(value) > 2**62:
            raise GradscopeError(f"{what}: got {value!r}; expected an integer")
        value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low} and {high}" if low is not None and high is not None else \
            (f"at least {low}" if low is not None else f"at most {high}")
        raise GradscopeError(f"{what}: got {value}; it must be {bounds}")
    return int(value)


def check_tensor(value: Any, what: str, *, kind: str = "any", ndim: int | tuple[int, ...] | None = None,
                 shape: tuple[int | None, ...] | None = None) -> torch.Tensor:
    """``value`` as a plain tensor: dense, strided, on the CPU, its storage holding every element
    (a stride-0 or overlapping view that would expand when copied is refused), of ``kind``
    ('int': integer dtype, 'float': floating point, 'number': either, or 'any'), with ``ndim``
    dimensions and a matching ``shape`` (None entries are free)."""
    if not isinstance(value, torch.Tensor):
        raise GradscopeError(f"{what}: got {type(value).__name__}; expected a tensor")
    if value.layout != torch.strided or value.is_meta or value.device.type != "cpu" or value.is_quantized:
        raise GradscopeError(f"{what}: a {value.layout} tensor on {value.device}; expected a dense CPU tensor")
    dtype = value.dtype
    is_int = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    ok = {"any": True, "int": is_int, "float": dtype.is_floating_point, "number": is_int or dtype.is_floating_point,
          "complex": dtype.is_complex or dtype.is_floating_point}[kind]
    if not ok:
        raise GradscopeError(f"{what}: dtype {str(dtype).replace('torch.', '')}; expected a{'n' if kind == 'int' else ''} "
                             f"{kind} tensor")
    if ndim is not None:
        dims = (ndim,) if isinstance(ndim, int) else ndim
        if value.dim() not in dims:
            raise GradscopeError(f"{what}: has {value.dim()} dimension(s) {tuple(value.shape)}; expected "
                                 f"{' or '.join(map(str, dims))}")
    if shape is not None and (len(shape) != value.dim() or any(s is not None and s != v for s, v in zip(shape, value.shape))):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise GradscopeError(f"{what}: shape {tuple(value.shape)}; expected {want}")
    if value.numel() > 0:
        stored = value.untyped_storage().nbytes()
        if any(s == 0 for s, n in zip(value.stride(), value.shape) if n > 1) or \
                value.numel() * value.element_size() > stored:
            raise GradscopeError(f"{what}: a view of {_size(stored)} posing as {tuple(value.shape)} "
                                 f"(stride {tuple(value.stride())}); expected a plain tensor")
    return value


def check_ids(ids: torch.Tensor, what: str, vocab: int) -> None:
    """Token ids in [0, vocab)."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise GradscopeError(f"{what}: token ids {int(ids.min())}..{int(ids.max())} lie outside the vocabulary "
                             f"0..{vocab - 1}")


_COMPONENT = re.compile(r"^[A-Za-z0-9_.,=+@-]+$")


def safe_component(name: Any, what: str) -> str:
    """A single file-name component built from outside data: no separator, no '..', no control
    character, not hidden, at most 200 characters."""
    if not isinstance(name, str) or not name or len(name) > 200 or not _COMPONENT.match(name) \
            or name.startswith(".") or name in (".", ".."):
        raise GradscopeError(f"{what}: got {str(name)[:60]!r}; expected a plain name (letters, digits and _ . , = + @ -, "
                             f"not starting with '.')")
    return name


def inside(root: Path, path: Any, what: str) -> Path:
    """``root / path``, resolved, refused unless it stays inside ``root`` (no '..', absolute path or
    symlink out)."""
    if not isinstance(path, (str, os.PathLike)) or "\x00" in str(path):
        raise GradscopeError(f"{what}: got {str(path)[:60]!r}; expected a relative path")
    root = Path(root).resolve()
    full = (root / path).resolve()
    if full != root and root not in full.parents:
        raise GradscopeError(f"{what}: {str(path)[:80]!r} points outside {root}")
    return full


# ---- temporaries and publication ---------------------------------------------------------------

_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<host>[A-Za-z0-9-]+)-(?P<pid>\d+)-[0-9a-f]{8}\.tmp$")


def temp_path(path: Path) -> Path:
    """A fresh temporary sibling of ``path``, named after this process: ``.NAME.HOST-PID-RAND.tmp``."""
    path = Path(path)
    return path.parent / f".{path.name}.{_HOST}-{os.getpid()}-{secrets.token_hex(4)}.tmp"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def remove_stale_temporaries(folder: Path, name: str | None = None) -> list[Path]:
    """Remove the temporaries in ``folder`` (of ``name`` only, if given) whose writer, a process of
    this host, no longer exists: the leftovers of a killed run. Returns what was removed."""
    removed: list[Path] = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for p in folder.iterdir():
        m = _TEMP.match(p.name)
        if not m or (name is not None and m["name"] != name) or m["host"] != _HOST or pid_alive(int(m["pid"])):
            continue
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def _renameat2() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        func = libc.renameat2
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


_RENAMEAT2 = _renameat2()
AT_FDCWD, RENAME_NOREPLACE = -100, 1


def _exists(path: Path, what: str) -> GradscopeError:
    return GradscopeError(f"{what}: {path} already exists (another run may have written it meanwhile); "
                          f"choose another path or pass overwrite=True")


def publish(tmp: Path, path: Path, *, overwrite: bool, what: str = "out") -> None:
    """Rename the finished temporary ``tmp`` to ``path``. With ``overwrite`` an existing file is
    replaced atomically (an existing directory is moved aside first and removed after; a symbolic
    link is replaced itself, never what it points to); without
    it, an existing ``path`` is never replaced, even one that appeared a moment ago."""
    tmp, path = Path(tmp), Path(path)
    if overwrite:
        if path.is_symlink():  # replace the link itself, atomically; what it points to is left untouched
            old = temp_path(path)
            os.replace(path, old)
            os.replace(tmp, path)
            old.unlink()
        elif path.is_dir():
            old = temp_path(path)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    else:
        if _RENAMEAT2 is not None:
            if _RENAMEAT2(AT_FDCWD, os.fsencode(tmp), AT_FDCWD, os.fsencode(path), RENAME_NOREPLACE) != 0:
                err = ctypes.get_errno()
                if err == errno.EEXIST:
                    raise _exists(path, what)
                if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise OSError(err, os.strerror(err), str(path))
            else:
                sync_dir(path.parent)
                return
        if tmp.is_dir():  # no renameat2: rename refuses a non-empty target directory
            if path.exists() or path.is_symlink():
                raise _exists(path, what)
            try:
                os.rename(tmp, path)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                    raise _exists(path, what) from None
                raise
        else:  # link(2) never replaces
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise _exists(path, what) from None
            tmp.unlink()
    sync_dir(path.parent)


def sync_dir(folder: Path) -> None:
    """fsync a directory, so that a rename in it survives a crash of the machine (best effort)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def disk_error(exc: OSError, path: Path, what: str = "out") -> GradscopeError:
    """A one-line user error for a write that failed for lack of space or permission."""
    reason = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
              errno.EFBIG: "file too large for this file system or limit", errno.EACCES: "permission denied",
              errno.EROFS: "read-only file system", errno.EPERM: "permission denied"}.get(exc.errno or 0)
    return GradscopeError(f"{what}: cannot write {path}: {reason or exc.strerror or type(exc).__name__}; "
                          f"nothing was written")


WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EROFS, errno.EPERM)
