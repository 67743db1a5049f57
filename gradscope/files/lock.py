"""One writer per run directory or grid point: an exclusive lock file with a heartbeat.

``gradscope train`` holds :func:`run_lock` for its run directory while it trains, so two trainers
started on one directory (``-o SAME`` or ``--resume SAME``) cannot interleave their checkpoints and
logs: the second gets a one-line error. The sweep holds :func:`point_lock` per grid point, because
dask may start a second copy of a task (a worker it lost contact with may still be running), and
a client interrupted while remote workers still train can be re-run at once; two trainers in one
run directory would interleave their checkpoints and logs. A point's task therefore holds
``runs/.<point>.lock``, created with O_EXCL (atomic on local filesystems and NFSv3+) and touched
every ``beat`` seconds. A lock is stale, and taken over, when its holder is a process of this host
that no longer exists, or when it has not been touched for ``stale_after`` seconds (a holder on
another host that died).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from gradscope.errors import GradscopeError
from gradscope.files.publish import WRITE_ERRORS, disk_error, pid_alive

STALE_AFTER = 120.0
BEAT = 15.0


def run_lock_path(run_dir: Path) -> Path:
    """The lock of a run directory: a hidden sibling ``.<name>.train.lock`` (outside the directory,
    so that it never counts as the run's content and a fresh start may create the directory)."""
    run_dir = Path(run_dir).resolve()  # one lock however the directory is spelled
    return run_dir.parent / f".{run_dir.name}.train.lock"


def run_lock(run_dir: Path) -> "contextlib.AbstractContextManager[None]":
    """Hold the single-writer lock of ``run_dir`` (see :func:`point_lock`)."""
    return point_lock(run_lock_path(run_dir), f"run directory {run_dir}")


def _holder(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # being written right now, or garbage: judged by its age alone


def is_stale(path: Path, stale_after: float = STALE_AFTER) -> bool:
    """Whether the lock at ``path`` may be taken over (see the module docstring)."""
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return True
    holder = _holder(path)
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) and not pid_alive(holder["pid"]):
        return True
    return age > stale_after


@contextmanager
def point_lock(path: Path, what: str, stale_after: float = STALE_AFTER, beat: float = BEAT) -> Iterator[None]:
    """Hold the lock at ``path`` while the block runs; a live holder is a user error naming it."""
    path = Path(path)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            if not path.parent.is_dir():
                raise GradscopeError(f"{what}: cannot create the lock {path}: {path.parent} is not a directory") from None
            if not is_stale(path, stale_after):
                h = _holder(path)
                raise GradscopeError(f"{what}: already being run by {h.get('host', '?')}:{h.get('pid', '?')} "
                                     f"(lock {path}); if that process is gone, the lock expires "
                                     f"{stale_after:.0f} s after its last heartbeat") from None
            path.unlink(missing_ok=True)
        except (NotADirectoryError, PermissionError) as exc:
            raise GradscopeError(f"{what}: cannot create the lock {path} ({exc.strerror})") from None
        except OSError as exc:
            if exc.errno in WRITE_ERRORS:
                raise disk_error(exc, path, what) from None
            raise
    with os.fdopen(fd, "w") as fh:
        json.dump(me, fh)
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(beat):
            try:
                os.utime(path)
            except OSError:
                return

    thread = threading.Thread(target=heartbeat, name=f"gradscope-lock-{path.name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if _holder(path).get("pid") == me["pid"] and _holder(path).get("host") == me["host"]:
            path.unlink(missing_ok=True)
