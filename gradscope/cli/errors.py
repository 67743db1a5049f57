"""The one place where user errors become a one-line message and exit status 2.

Library errors name Python parameters (``position: got 40; …``, ``pass overwrite=True``, ``add
task to `by```); here they are rewritten to the command's own flags (``--target-pos: got 40; …``,
``pass --overwrite``, ``add task to --by``).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, TypeVar

import typer
from rich.console import Console

from gradscope.errors import GradscopeError

F = TypeVar("F", bound=Callable[..., Any])
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

# Python parameter → flag, where the flag is not the parameter's name with dashes.
RENAMED = {"probes_file": "--probes", "target_groups": "--target-freq", "disturbant_groups": "--disturbant",
           "position": "--target-pos", "chunk": "--batch-size", "model_factory": "--model-factory",
           "core": "--model", "vocab_size": "--vocab", "hidden_size": "--hidden", "embed_size": "--embed",
           "num_layers": "--layers"}
_LEAD = re.compile(r"^([a-z][a-z0-9_]*(?:/[a-z][a-z0-9_]*)*):")
_ASSIGN = re.compile(r"\b([a-z][a-z0-9_]*)=(True\b|'[^']*')|`([a-z][a-z0-9_]*)`")


def to_flags(message: str, options: set[str]) -> str:
    """Rewrite the Python parameter names in ``message`` to flags among ``options`` (e.g. {"--out"})."""

    def flag(name: str) -> str | None:
        for candidate in (RENAMED.get(name), "--" + name.replace("_", "-")):
            if candidate in options:
                return candidate
        return None

    lead = _LEAD.match(message)
    if lead:
        names = lead.group(1).split("/")
        flags = [flag(n) for n in names]
        if all(flags):
            message = "/".join(f for f in flags if f) + message[lead.end(1):]

    def assign(m: re.Match[str]) -> str:
        f = flag(m.group(1) or m.group(3))
        if f is None:
            return m.group(0)
        if m.group(3):  # `name`
            return f
        return f if m.group(2) == "True" else f"{f} {m.group(2)[1:-1]}"

    return _ASSIGN.sub(assign, message)


def _options(args: tuple[Any, ...], kwargs: dict[str, Any]) -> set[str]:
    """The flags of the running command (every command takes its ``typer.Context`` as ``ctx``)."""
    ctx = kwargs.get("ctx") or next((a for a in args if isinstance(a, typer.Context)), None)
    return {opt for p in ctx.command.get_params(ctx) for opt in p.opts} if ctx is not None else set()


def user_errors(func: F) -> F:
    """Wrap a command: GradscopeError → 'error: …' (in the command's flags) on stderr, exit 2;
    Ctrl-C → exit 130."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except GradscopeError as exc:
            err_console.print(f"error: {to_flags(' '.join(str(exc).split()), _options(args, kwargs))}", markup=False)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err_console.print("interrupted", markup=False)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]
