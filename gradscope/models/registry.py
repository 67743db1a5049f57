"""The core registry: name → core class. Each class carries its own config (``Config``), its
report label and how to build it, so this dict drives config validation, model building, CLI
choices and report labels. Adding a core = one file with its class + one line here + one test."""

from __future__ import annotations

from gradscope.errors import GradscopeError
from gradscope.models.core import Core
from gradscope.models.elman import ElmanCore
from gradscope.models.gru import GRUCore
from gradscope.models.lstm import LSTMCore
from gradscope.models.s4d import S4DCore

CORES: dict[str, type[Core]] = {
    "elman": ElmanCore,
    "gru": GRUCore,
    "lstm": LSTMCore,
    "s4d": S4DCore,
}


def core_class(name: str) -> type[Core]:
    """The registered core called ``name``."""
    if name not in CORES:
        raise GradscopeError(f"core: got {name!r}; valid values are {', '.join(CORES)}")
    return CORES[name]
