"""The core registry: name → core class. Each class carries its own config (``Config``), its
report label and how to build it, so this dict drives config validation, model building, CLI
choices and options, sweep axes, report labels and summary fields. Adding a core = one file with
its class + one line here + one test."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gradscope.errors import GradscopeError
from gradscope.models.core import Core
from gradscope.models.elman import ElmanCore
from gradscope.models.gru import GRUCore
from gradscope.models.lstm import LSTMCore
from gradscope.models.mamba import MambaCore
from gradscope.models.mingru import MinGRUCore
from gradscope.models.s4d import S4DCore

CORES: dict[str, type[Core]] = {
    "elman": ElmanCore,
    "gru": GRUCore,
    "lstm": LSTMCore,
    "s4d": S4DCore,
    "mingru": MinGRUCore,
    "mamba": MambaCore,
}


def core_class(name: str) -> type[Core]:
    """The registered core called ``name``."""
    if name not in CORES:
        raise GradscopeError(f"core: got {name!r}; valid values are {', '.join(CORES)}")
    return CORES[name]


@dataclass(frozen=True)
class CoreOption:
    """A setting of one or more cores' own configs, made with :func:`gradscope.fields.option`: a
    ``gradscope train --<name>`` option, a sweep axis, a summary field and a label short name."""

    name: str  # the config field (the CLI flag is --name with dashes)
    kind: type  # int, float, str or bool: the type of its default
    help: str
    short: str | None  # how labels write it (state_size → N)
    alias: str | None  # its name in `summarize --by`
    low: float | None
    high: float | None
    cores: tuple[str, ...]  # the registered cores that have it


def core_options() -> dict[str, CoreOption]:
    """Every registered core's options, by field name (a name several cores share is one option, of
    one type). Computed from the registry on each call, so a core registered at run time has its own."""
    out: dict[str, CoreOption] = {}
    for core, cls in CORES.items():
        for f in dataclasses.fields(cls.Config):
            if "help" not in f.metadata:
                continue
            low, high = f.metadata.get("range", (None, None))
            seen = out.get(f.name)
            if seen is not None:
                if seen.kind is not type(f.default):
                    raise GradscopeError(f"core {core!r}: its option {f.name} is a {type(f.default).__name__}, "
                                         f"but {', '.join(seen.cores)} made it a {seen.kind.__name__}")
                helps = seen.help if f.metadata["help"] == seen.help else \
                    f"{seen.help if len(seen.cores) > 1 else f'{seen.cores[0]}: {seen.help}'} {core}: {f.metadata['help']}"
                out[f.name] = dataclasses.replace(seen, help=helps, cores=(*seen.cores, core))
            else:
                out[f.name] = CoreOption(f.name, type(f.default), f.metadata["help"], f.metadata.get("short"),
                                         f.metadata.get("alias"), low, high, (core,))
    return out
