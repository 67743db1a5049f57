"""The one place where user errors become a one-line message and exit status 2.

Library errors start with the Python parameter they are about (``target_pos: got 40; …``), and
every parameter has its flag's name, so the flag is that name with dashes: the message
is printed with ``--target-pos`` in its place when the command has that flag, and as it is
otherwise. No table of renamings, no rewriting inside the sentence.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, TypeVar

import typer
from rich.console import Console

from gradscope.errors import GradscopeError, GradscopeWarning

F = TypeVar("F", bound=Callable[..., Any])
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def to_flags(message: str, options: set[str]) -> str:
    """``message`` with its leading parameter name(s) (``name:`` or ``a/b:``) written as the
    command's flags, where the command has them (``options``, e.g. {"--out"})."""
    head, sep, rest = message.partition(":")
    names = head.split("/")
    flags = ["--" + n.replace("_", "-") for n in names]
    if sep and all(n.isidentifier() and n.islower() for n in names) and all(f in options for f in flags):
        return "/".join(flags) + sep + rest
    return message


def _options(args: tuple[Any, ...], kwargs: dict[str, Any]) -> set[str]:
    """The flags of the running command (every command takes its ``typer.Context`` as ``ctx``)."""
    ctx = kwargs.get("ctx") or next((a for a in args if isinstance(a, typer.Context)), None)
    return {opt for p in ctx.command.get_params(ctx) for opt in p.opts} if ctx is not None else set()


def _library_warnings() -> warnings.catch_warnings:
    """Within it, every :class:`GradscopeWarning` the library raises is printed at once as one line,
    ``warning: …`` on stderr, each distinct message once per command; other warnings as Python shows them."""
    said: set[str] = set()
    context = warnings.catch_warnings()
    context.__enter__()
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202
        if not issubclass(category, GradscopeWarning):
            return shown(message, category, filename, lineno, file, line)
        text = " ".join(str(message).split())
        if text not in said:
            said.add(text)
            err_console.print(f"warning: {text}", markup=False)

    warnings.simplefilter("always", GradscopeWarning)
    warnings.showwarning = show
    return context


def user_errors(func: F) -> F:
    """Wrap a command: GradscopeError → 'error: …' (in the command's flags) on stderr, exit 2;
    Ctrl-C → exit 130; a GradscopeWarning → 'warning: …' on stderr when it is raised."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        context = _library_warnings()
        try:
            return func(*args, **kwargs)
        except GradscopeError as exc:
            err_console.print(f"error: {to_flags(' '.join(str(exc).split()), _options(args, kwargs))}", markup=False)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err_console.print("interrupted", markup=False)
            raise typer.Exit(130) from None
        finally:
            context.__exit__(None, None, None)

    return wrapper  # type: ignore[return-value]
