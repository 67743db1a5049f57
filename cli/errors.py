"""The one place where user errors become a one-line message and exit status 2."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import typer
from rich.console import Console

from gradscope.errors import GradscopeError

F = TypeVar("F", bound=Callable[..., Any])
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def user_errors(func: F) -> F:
    """Wrap a command: GradscopeError → 'error: …' on stderr, exit 2; Ctrl-C → exit 130."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except GradscopeError as exc:
            err_console.print(f"error: {exc}", markup=False)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err_console.print("interrupted", markup=False)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]
