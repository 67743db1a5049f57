"""Options generated from an options dataclass: each field declared with
:func:`gradscope.fields.option` is one option, ``--<field name>`` (dashes for underscores), its help
from the field, its default the field's default; the dataclass's ``__post_init__`` checks the
values. Generated when the command is parsed or its help shown, so `gradscope --help` imports no
model code; the command receives the values in ``ctx.meta[SETTINGS]`` and builds the dataclass with
:func:`build_options`."""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from functools import lru_cache
from typing import Annotated, Any, Callable, Optional

import typer
from typer.core import TyperCommand

from gradscope.fields import with_names

from .common import SETTINGS


def click_params(params: list[inspect.Parameter]) -> list[Any]:
    """The click options typer makes of ``params`` (a signature built here, as it makes written ones)."""

    def generated(**_: Any) -> None:
        """Generated options."""

    generated.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    holder = typer.Typer(add_completion=False)
    holder.command()(generated)
    return list(typer.main.get_command(holder).params)


def _cli_type(hint: Any) -> tuple[Any, bool]:
    """(the option's type, repeatable) for a field's type: ``X | None`` is an optional X, a
    ``tuple[X, ...]`` a repeatable option of X."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return _cli_type(inner[0]) if len(inner) == 1 else (str, False)
    if typing.get_origin(hint) is tuple:
        return args[0], True
    return hint, False


@lru_cache(maxsize=None)
def field_params(cls: type) -> tuple[Any, ...]:
    """One click option per field of ``cls`` that carries help (:func:`gradscope.fields.option`)."""
    hints = typing.get_type_hints(cls)
    # the class's own fields first, then those it inherits (a task family's own options, FamilyOptions)
    inherited = {f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
    params = []
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.name in inherited):
        if "help" not in f.metadata:
            continue
        kind, repeat = _cli_type(hints[f.name])
        flag = "--" + (f.metadata.get("flag") or f.name).replace("_", "-")
        if kind is bool:  # a switch both ways: --grid/--no-grid (None: neither given)
            flag = f"{flag}/--no-{flag[2:]}"
        default = None if repeat or f.default is dataclasses.MISSING else f.default
        # a number is parsed leniently (1e9 is a count; text that is no number goes on to the dataclass's check,
        # which refuses it in one line naming the option)
        parser, metavar = {int: (_int, "<int>"), float: (_float, "<float>")}.get(kind, (None, None)) \
            if not repeat else (None, None)
        extra = {"parser": parser, "metavar": metavar} if parser is not None else {}
        annotation = Annotated[Optional[list[kind]] if repeat else kind if default is not None else Optional[kind],
                               typer.Option(flag, *f.metadata.get("also", ()), help=with_names(f.metadata["help"]),
                                            show_default=default is not None, **extra)]
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
    return tuple(click_params(params))


def build_options(cls: type, values: dict[str, Any]) -> Any:
    """``cls`` from the generated options' values, those of its own fields (a command generates the options of
    several dataclasses; an option left out keeps the field's default)."""
    own = {f.name for f in dataclasses.fields(cls)}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()
             if k in own and v is not None and v not in ([], ())}
    return cls(**given)


def _int(text: str) -> Any:
    """A count option: an integer, also written like 1e9. Text that is no number is passed on as
    it is, for the configuration check to refuse in one line (naming the option)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if math.isfinite(value) and value == int(value) else text


def _float(text: str) -> Any:
    """A real option; text that is no number is passed on, as for :func:`_int`."""
    try:
        return float(text)
    except ValueError:
        return text


def setting_params() -> list[Any]:
    """One click option per setting of a run (:func:`gradscope.presets.settings`: the config
    sections' fields declared with ``gradscope.fields.option``, then every registered core's own),
    flag ``--<field name>``, default None (the preset's value), its range in the help. Made on each call: a core
    registered at run time brings its own."""
    from gradscope.presets import settings

    params = []
    for o in settings().values():
        parser, metavar = {int: (_int, "<int>"), float: (_float, "<float>")}.get(o.kind, (None, None))
        span = "" if o.low is None and o.high is None else \
            f"{'' if o.low is None else f'>= {o.low}'}{', ' if None not in (o.low, o.high) else ''}{'' if o.high is None else f'<= {o.high}'}"
        note = "; ".join(p for p in (", ".join(o.cores), span) if p)
        extra = {"parser": parser, "metavar": metavar} if parser is not None else {}
        flag = "--" + o.name.replace("_", "-")
        annotation = Annotated[Optional[o.kind], typer.Option(flag, help=f"{o.help} ({note})" if note else o.help,
                                                              **extra)]
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation))
    return click_params(params)


def generated_command(cls: type, after: str | None = None, *more: type) -> type[TyperCommand]:
    """A TyperCommand class whose options also include the fields of the options dataclass ``cls``
    (:func:`field_params`; a torch-free class, so that --help loads no torch), inserted after the option
    named ``after`` (else first among the options); then those of ``more`` (a command with two modes,
    each its own dataclass: a field both declare is one option, the first's)."""

    def generated() -> list[Any]:
        seen: dict[str, Any] = {}
        for c in (cls, *more):
            seen.update({p.name: p for p in field_params(c) if p.name not in seen})
        return list(seen.values())

    return command_with(generated, after)


def command_with(generated: Callable[[], list[Any]], after: str | None) -> type[TyperCommand]:
    """A TyperCommand class with the options ``generated()`` makes (when the command is parsed or its help
    shown) inserted after the option named ``after`` (else first among the options); the command receives their
    values in ``ctx.meta[SETTINGS]``."""

    class GeneratedCommand(TyperCommand):
        def get_params(self, ctx: typer.Context) -> list[Any]:
            params = super().get_params(ctx)
            own = {p.name for p in params}
            extra = [p for p in generated() if p.name not in own]
            at = next((i + 1 for i, p in enumerate(params) if p.name == after),
                      next((i for i, p in enumerate(params) if p.param_type_name == "option"), len(params)))
            return params[:at] + extra + params[at:]

        def invoke(self, ctx: typer.Context) -> Any:
            names = {p.name for p in generated()}
            ctx.meta[SETTINGS] = {k: ctx.params.pop(k) for k in list(ctx.params) if k in names}
            return super().invoke(ctx)

    return GeneratedCommand
