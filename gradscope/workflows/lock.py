"""One runner per grid point: an exclusive lock file with a heartbeat.

dask may start a second copy of a task (a worker it lost contact with may still be running), and
a client interrupted while remote workers still train can be re-run at once; two trainers in one
run directory would interleave their checkpoints and logs. A point's task therefore holds
``runs/.<point>.lock``, created with O_EXCL (atomic on local filesystems and NFSv3+) and touched
every ``beat`` seconds. A lock is stale, and taken over, when its holder is a process of this host
that no longer exists, or when it has not been touched for ``stale_after`` seconds (a holder on
another host that died).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from gradscope.errors import GradscopeError

STALE_AFTER = 120.0
BEAT = 15.0


def _holder(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # being written right now, or garbage: judged by its age alone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(path: Path, stale_after: float = STALE_AFTER) -> bool:
    """Whether the lock at ``path`` may be taken over (see the module docstring)."""
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return True
    holder = _holder(path)
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) and not _alive(holder["pid"]):
        return True
    return age > stale_after


@contextmanager
def point_lock(path: Path, what: str, stale_after: float = STALE_AFTER, beat: float = BEAT) -> Iterator[None]:
    """Hold the lock at ``path`` while the block runs; a live holder is a user error naming it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            if not is_stale(path, stale_after):
                h = _holder(path)
                raise GradscopeError(f"{what}: already being run by {h.get('host', '?')}:{h.get('pid', '?')} "
                                     f"(lock {path}); if that process is gone, the lock expires "
                                     f"{stale_after:.0f} s after its last heartbeat") from None
            path.unlink(missing_ok=True)
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
