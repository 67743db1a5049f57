"""gradscope: analysis and diagnostics for trained recurrent and state-space models.

The public Python API (each name is imported on first use, so ``import gradscope`` and the
command line start fast):

- :func:`load` — a gradscope or paper checkpoint (or a run directory's latest) → :class:`Loaded`;
- :func:`wrap` — a user's ``nn.RNN``/``nn.GRU``/``nn.LSTM`` or protocol core → a model gradscope analyses;
- :func:`state_jacobian` — J = ∂y_T/∂z_p per sequence;
- :func:`stability` — gradient stability on probe triplets → an xarray Dataset (a stability store's variables);
- :func:`make_probes`, :func:`frequency_groups`, :class:`Probes` — probe triplets;
- the configs, :class:`GradscopeError` (every user error), ``__version__``.
"""

from __future__ import annotations

import importlib
from typing import Any

from gradscope.errors import GradscopeError

_EXPORTS = {
    "__version__": "gradscope.version",
    "load": "gradscope.files.checkpoint", "Loaded": "gradscope.files.checkpoint",
    "wrap": "gradscope.models.wrap", "WrappedModel": "gradscope.models.wrap",
    "state_jacobian": "gradscope.analysis.jacobian", "JacobianResult": "gradscope.analysis.jacobian",
    "stability": "gradscope.workflows.stability", "dynamics": "gradscope.workflows.dynamics",
    "Probes": "gradscope.tasks.probes", "make_probes": "gradscope.tasks.probes",
    "frequency_groups": "gradscope.tasks.probes",
    "ModelConfig": "gradscope.config", "RunConfig": "gradscope.config", "TaskConfig": "gradscope.config",
    "TrainConfig": "gradscope.config", "CORES": "gradscope.models.registry",
}
__all__ = ["GradscopeError", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gradscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
