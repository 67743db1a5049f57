"""Fault injection for the hardening suite (issue #15): gradscope commands in real child processes
that can be killed with SIGKILL, run under a file-size limit, or released together from a barrier.

A child is forked from the test process, which has already imported torch, xarray and zarr, so it
starts in milliseconds instead of the ~8 s a fresh interpreter takes here (torch, then
``torch._dynamo`` pulled in by Adam). It is still a real process: SIGKILL ends it without running
a ``finally`` or an ``atexit``, and ``RLIMIT_FSIZE`` applies to its own writes. It runs the
console script's code (``gradscope.cli.app``), with stdout and stderr in files, so its exit
status and output are those of ``gradscope ARGS``: an exception that escapes the command is
printed as a traceback with exit status 1, as the interpreter would.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from tests.helpers.fuzzkit import Outcome

# Python sets SIGXFSZ to "ignore" at start-up, so a write past RLIMIT_FSIZE fails with EFBIG instead
# of killing the process; forked children inherit that.
assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN


class Gate:
    """A barrier for children: each waits at start until :meth:`open` releases them all at once."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()

    def wait_in_child(self) -> None:
        os.close(self.w)
        os.read(self.r, 1)  # returns b"" once every write end is closed: the parent's is the last
        os.close(self.r)

    def open(self) -> None:
        os.close(self.w)
        os.close(self.r)


@dataclass
class Child:
    pid: int
    logs: Path
    status: int | None = field(default=None)

    def poll(self) -> int | None:
        """The exit status (−N for a signal), or None while it runs."""
        if self.status is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
        return self.status

    def wait(self, timeout: float = 60.0) -> int:
        end = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > end:
                self.kill()
                raise AssertionError(f"child {self.pid} still running after {timeout} s; stderr: {self.err[-2000:]}")
            time.sleep(0.005)
        assert self.status is not None
        return self.status

    def kill(self) -> None:
        """SIGKILL, as `kill -9` does; a child that already ended is left as it ended."""
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, st = os.waitpid(self.pid, 0)
            self.status = os.waitstatus_to_exitcode(st)

    @property
    def out(self) -> str:
        return (self.logs.with_suffix(".out")).read_text(errors="replace")

    @property
    def err(self) -> str:
        return (self.logs.with_suffix(".err")).read_text(errors="replace")

    def outcome(self, timeout: float = 60.0) -> Outcome:
        """Wait, then the ending in fuzzkit's terms (a traceback shows as exit 1 with it on stderr)."""
        rc = self.wait(timeout)
        return Outcome(rc, self.out, self.err, None, "")


_serial = 0


def fork_call(func: Callable[[], object], *, cwd: Path, logs: Path, fsize: int | None = None,
              gate: Gate | None = None, setup: Callable[[], None] | None = None) -> Child:
    """Call ``func()`` in a forked child working in ``cwd``; its exit status is 0 when it returns,
    the code of a SystemExit, or 1 with the traceback on stderr. ``fsize``: RLIMIT_FSIZE in bytes
    (writes past it fail with EFBIG; stdout then goes to /dev/null, which no limit applies to, so
    a long table cannot use up the limit). ``gate``: wait there before starting. ``setup``: run in
    the child first (to make a write slow or observable; never to change what is written)."""
    global _serial
    _serial += 1
    logs.mkdir(parents=True, exist_ok=True)
    base = logs / f"child-{_serial}"
    base.with_suffix(".out").write_text("")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return Child(pid, base)
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        for fd, suffix in ((1, ".out"), (2, ".err")):
            if fd == 1 and fsize is not None:
                os.dup2(null, 1)
                continue
            f = os.open(base.with_suffix(suffix), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ["COLUMNS"] = "200"
        os.chdir(cwd)
        if gate is not None:
            gate.wait_in_child()
        if setup is not None:
            setup()
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        try:
            func()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - what the interpreter would print for an escaping exception
            traceback.print_exc()
            code = 1
    except BaseException:  # noqa: BLE001 - the harness itself failed in the child
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code)


def spawn(args: Iterable[object], *, cwd: Path, logs: Path, fsize: int | None = None, gate: Gate | None = None,
          setup: Callable[[], None] | None = None) -> Child:
    """``gradscope ARGS`` in a forked child (see :func:`fork_call`), as the console script runs it."""
    argv = [str(a) for a in args]

    def cli() -> None:
        from gradscope.cli.app import app
        app(args=argv, prog_name="gradscope")

    return fork_call(cli, cwd=cwd, logs=logs, fsize=fsize, gate=gate, setup=setup)


def wait_for(condition: Callable[[], bool], child: Child, timeout: float = 30.0, what: str = "") -> bool:
    """Poll ``condition`` every millisecond; False if ``child`` ended first (or on timeout)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        if child.poll() is not None:
            return condition()
        time.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")


def slow(seconds: float, *, torch_save: bool = False, write_text: bool = False, fsync: bool = False,
         zarr: bool = False, mkdir: bool = False, marker: Path | None = None) -> Callable[[], None]:
    """A ``setup`` that makes writes slow, so a kill can land in the middle of one: ``torch.save`` and
    ``Path.write_text`` write the first half of their bytes, pause, then the rest; ``os.fsync`` pauses
    first; a zarr store pauses before each file (chunk or metadata) it writes; ``Path.mkdir`` pauses
    first (so that two writers both check a folder before either creates it). What ends up on disk
    is unchanged. During each pause of a write, the file ``marker`` holds the path being written, so
    the parent can kill the child inside that write (:func:`writing`), however the library names
    its files."""

    def setup() -> None:
        import io
        import pathlib

        import torch

        real_save, real_fsync, real_mkdir = torch.save, os.fsync, pathlib.Path.mkdir

        def pause(target: object) -> None:
            if marker is not None:
                with open(marker, "w") as fh:  # not Path.write_text: that may be the patched one
                    fh.write(str(getattr(target, "name", target)))
            time.sleep(seconds)
            if marker is not None and os.path.exists(marker):
                os.unlink(marker)

        def halves(target: object, data: bytes) -> None:
            if isinstance(target, (str, os.PathLike)):
                with open(target, "wb") as fh:
                    fh.write(data[: len(data) // 2])
                    fh.flush()
                    pause(target)
                    fh.write(data[len(data) // 2:])
            else:
                target.write(data[: len(data) // 2])  # type: ignore[attr-defined]
                target.flush()  # type: ignore[attr-defined]
                pause(target)
                target.write(data[len(data) // 2:])  # type: ignore[attr-defined]

        def save(obj: object, f: object, *a: object, **k: object) -> None:
            buffer = io.BytesIO()
            real_save(obj, buffer, *a, **k)
            halves(f, buffer.getvalue())

        def write_text_(self: pathlib.Path, data: str, *a: object, **k: object) -> int:
            halves(self, data.encode())
            return len(data)

        def fsync_(fd: int) -> None:
            time.sleep(seconds)
            real_fsync(fd)

        if torch_save:
            torch.save = save  # type: ignore[assignment]
        if write_text:
            pathlib.Path.write_text = write_text_  # type: ignore[method-assign]
        def mkdir_(self: pathlib.Path, *a: object, **k: object) -> None:
            time.sleep(seconds)
            real_mkdir(self, *a, **k)  # type: ignore[arg-type]

        if fsync:
            os.fsync = fsync_  # type: ignore[assignment]
        if mkdir:
            pathlib.Path.mkdir = mkdir_  # type: ignore[method-assign]
        if zarr:
            import asyncio

            from zarr.storage import LocalStore
            real_set = LocalStore.set

            async def set_(self: LocalStore, key: str, value: object) -> None:
                if marker is not None:
                    with open(marker, "w") as fh:
                        fh.write(f"{self.root}/{key}")
                await asyncio.sleep(seconds)
                result = await real_set(self, key, value)  # type: ignore[arg-type]
                if marker is not None and os.path.exists(marker):  # several writes may pause at once
                    try:
                        os.unlink(marker)
                    except FileNotFoundError:
                        pass
                return result

            LocalStore.set = set_  # type: ignore[method-assign]

    return setup


def writing(marker: Path, name: str = "") -> bool:
    """True while a slowed write (see :func:`slow`) of a path containing ``name`` is paused."""
    try:
        return name in marker.read_text()
    except FileNotFoundError:
        return False


def temporaries(root: Path) -> list[str]:
    """Every temporary under ``root``: ``*.tmp`` / ``*.old`` files and directories, at any depth."""
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.name.endswith((".tmp", ".old")))
