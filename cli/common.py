"""Small helpers shared by the commands."""

from __future__ import annotations

import shlex

import typer


def command_line(ctx: typer.Context) -> str:
    """The current command as a shell line, rebuilt from the parsed parameters (provenance).

    Only parameters that differ from their defaults are listed; arguments come first.
    """
    parts = ["gradscope", ctx.info_name or ""]
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
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
