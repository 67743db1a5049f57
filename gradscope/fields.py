"""Field checks and dict → dataclass conversion shared by every frozen config."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from gradscope.errors import GradscopeError, check

C = TypeVar("C")


def one_of(name: str, value: object, valid: tuple[str, ...] | list[str]) -> None:
    check(value in valid, f"{name}: got {value!r}; valid values are {', '.join(valid)}")


def positive(name: str, value: float) -> None:
    check(value > 0, f"{name}: got {value}; it must be positive")


def from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Build config ``cls`` from a plain dict (JSON or checkpoint), rejecting unknown keys."""
    check(isinstance(data, dict), f"{cls.__name__}: expected a mapping of fields; got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise GradscopeError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}")
    clean = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return cls(**clean)


def option(default: Any, help: str, *, short: str | None = None, alias: str | None = None,
           low: float | None = None, high: float | None = None, flag: str | None = None) -> Any:
    """A config field that is also a user-facing setting: ``gradscope train --<name>``, a sweep axis,
    a summary field (``--by <alias>``) and a report label (``<short>=value``). ``low``/``high``: the
    range the CLI's help states (the config's own checks enforce it). ``flag``: the setting's name
    where it is not the field's own (the task's ``name`` is ``--task``, as its errors say)."""
    return dataclasses.field(default=default, metadata={"help": help, "short": short, "alias": alias,
                                                        "range": (low, high), "flag": flag})
