"""Small helpers shared by the commands."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


import typer
from rich.console import Console

from gradscope.errors import GradscopeError


SETTINGS = "gradscope.settings"  # ctx.meta key: the values of options generated per call (cli/train.py)


def command_line(ctx: typer.Context) -> str:
    """The current command as a shell line, rebuilt from the parsed parameters (provenance).

    Only parameters that differ from their defaults are listed; arguments come first.
    """
    parts = ["gradscope", ctx.info_name or ""]
    generated = ctx.meta.get(SETTINGS, {})  # options a command generates (train's settings), as it left them
    for param in ctx.command.get_params(ctx):
        value = ctx.params.get(param.name or "", generated.get(param.name or ""))
        if value is None or value == param.default or value == () or value is False:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        if param.param_type_name == "argument":
            parts.extend(str(v) for v in values)
        elif value is True:
            parts.append(param.opts[0])
        else:
            for v in values:
                parts.extend([param.opts[0], str(v)])
    return shlex.join(p for p in parts if p)


def given(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` (its Python name) was given (command line or environment), not left
    at its default: an option given where it does not apply is refused, one left alone is not."""
    source = ctx.get_parameter_source(name)  # typer's own click's ParameterSource: compared by name
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def refuse_given(ctx: typer.Context, names: list[str], why: str) -> None:
    """One line naming every option of ``names`` that was given, with ``why`` they do not apply."""
    flags = [f"--{n.replace('_', '-')}" for n in names if given(ctx, n)]
    if flags:
        raise GradscopeError(f"{'/'.join(flags)}: {why}; remove {' and '.join(flags)}")


def default_out(kind: str, source: Path) -> Path:
    """<kind>-<name>.zarr in the working directory, numbered -2, -3… so nothing is overwritten."""
    name = source.name if source.is_dir() else source.stem
    path, n = Path(f"{kind}-{name}.zarr"), 1
    while path.exists():
        n += 1
        path = Path(f"{kind}-{name}-{n}.zarr")
    return path


def make_console() -> Console:
    """A console for tables: the terminal's width, or 120 columns when output is piped (rich
    would otherwise assume 80 and squeeze the tables)."""
    return Console() if sys.stdout.isatty() else Console(width=120)


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an output store before any work is done: an existing path without ``--overwrite``,
    an existing file (a store is a directory), or a missing parent directory. (Writing refuses an
    existing store again, atomically, in case one appears meanwhile.)"""
    from gradscope.store.io import check_store_target

    if (out.exists() or out.is_symlink()) and not overwrite:
        raise GradscopeError(f"--out: {out} already exists; choose another path or pass --overwrite")
    check_store_target(out, overwrite, "--out")


def warn(message: str) -> None:
    """One line on stderr: ``warning: message``."""
    from .errors import err_console
    err_console.print(f"warning: {' '.join(message.split())}", markup=False)
