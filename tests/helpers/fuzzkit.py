"""The hardening suite's harness (issue #15): run a command in-process, judge how it ended, and check
that no file was left half-written, replaced or escaped.

Every fuzz test feeds a mutated input to a gradscope command and requires one of two endings:
- exit 0 (the test then checks the output is right), or
- exit 2 with exactly one line on stderr, starting ``error:``;
never a traceback (an exception escaping the command), never another exit status, never a
temporary left behind, never an existing file changed.
"""

from __future__ import annotations

import hashlib
import os
import stat
import traceback
from unittest import mock
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from typer.testing import CliRunner

MUTATIONS: dict[str, int] = {}  # test family → mutations tried (printed at the end of the session)


def count(family: str, n: int = 1) -> None:
    MUTATIONS[family] = MUTATIONS.get(family, 0) + n


@dataclass
class Outcome:
    rc: int
    out: str
    err: str
    exc: BaseException | None
    tb: str

    def clean(self) -> bool:
        return self.problem() is None

    def problem(self) -> str | None:
        """Why this ending is not acceptable, or None."""
        if self.exc is not None and not isinstance(self.exc, SystemExit):
            return f"traceback: {type(self.exc).__name__}: {self.exc}\n{self.tb}"
        if self.rc == 0:
            return None
        if self.rc != 2:
            return f"exit {self.rc} (expected 0 or 2); stderr: {self.err[-2000:]}"
        lines = [ln for ln in self.err.splitlines() if ln.strip()]
        if len(lines) != 1 or not lines[0].startswith("error: "):
            return f"exit 2 but stderr is not one 'error:' line: {self.err[-2000:]!r}"
        return None


_COMMAND: list[Any] = []


def _command() -> Any:
    """The click command of the CLI, built once (typer rebuilds it on every invoke: ~0.25 s)."""
    if not _COMMAND:
        import typer.main

        from gradscope.cli.app import app
        _COMMAND.append(typer.main.get_command(app))
    return _COMMAND[0]


def invoke(args: Iterable[str | Path]) -> Outcome:
    """Run ``gradscope ARGS`` in this process (Click's runner: stdout and stderr apart)."""
    import typer.testing

    from gradscope.cli.app import app
    with mock.patch.object(typer.testing, "_get_command", lambda _app: _command()):
        result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=True)
    exc = result.exception
    tb = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info and exc is not None \
        and not isinstance(exc, SystemExit) else ""
    return Outcome(result.exit_code, result.stdout, result.stderr, exc, tb)


def assert_clean(outcome: Outcome, context: str = "") -> None:
    problem = outcome.problem()
    assert problem is None, f"{context}: {problem}"


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path → sha256; directories as 'dir')."""
    root = Path(root)
    found: dict[str, str] = {}
    if not root.exists():
        return found
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        m = p.lstat().st_mode  # never follow a link, never open a FIFO or a device
        found[rel] = (f"link {os.readlink(p)}" if stat.S_ISLNK(m) else "dir" if stat.S_ISDIR(m)
                      else hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(m) else "special")
    return found


def leftovers(root: Path) -> list[str]:
    """Temporaries (``*.tmp``, ``*.old``) anywhere under ``root``."""
    return [str(p) for p in Path(root).rglob("*") if p.name.endswith((".tmp", ".old"))]


def assert_untouched(before: dict[str, str], after: dict[str, str], new_ok: Iterable[str] = ()) -> None:
    """Files present before are unchanged; new files only under ``new_ok`` prefixes; no temporaries."""
    changed = [k for k, v in before.items() if after.get(k) != v]
    assert not changed, f"files changed or removed: {changed[:5]}"
    allowed = tuple(new_ok)
    new = [k for k in after if k not in before and not (allowed and k.startswith(allowed))]
    assert not new, f"unexpected new files: {new[:5]}"
    tmps = [k for k in after if k.endswith((".tmp", ".old")) or ".tmp/" in k]
    assert not tmps, f"temporaries left: {tmps[:5]}"
