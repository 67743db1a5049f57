"""Temporaries and publication: how every file and store gets onto disk (moved from guard.py).

:func:`temp_path` names a temporary sibling after its owner's pid, so
:func:`remove_stale_temporaries` can remove the leftovers of a killed run (and never a live
writer's); :func:`publish` renames it into place, either atomically replacing or refusing to
replace (``renameat2(RENAME_NOREPLACE)``, or ``link`` for files), so that of two concurrent writers
without ``overwrite`` exactly one succeeds. :func:`disk_error` turns a full disk or a missing
permission into a one-line user error.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any

from gradscope.errors import GradscopeError

OUT_LABEL = "out"  # what errors call the path being written unless told: the commands' --out (-o)
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
                          f"choose another path or pass overwrite=True (--overwrite)")


def publish(tmp: Path, path: Path, *, overwrite: bool, what: str = OUT_LABEL) -> None:
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


def disk_error(exc: OSError, path: Path, what: str = OUT_LABEL) -> GradscopeError:
    """A one-line user error for a write that failed for lack of space or permission."""
    reason = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
              errno.EFBIG: "file too large for this file system or limit", errno.EACCES: "permission denied",
              errno.EROFS: "read-only file system", errno.EPERM: "permission denied"}.get(exc.errno or 0)
    return GradscopeError(f"{what}: cannot write {path}: {reason or exc.strerror or type(exc).__name__}; "
                          f"nothing was written")


WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EROFS, errno.EPERM)
