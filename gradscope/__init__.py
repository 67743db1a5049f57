"""gradscope: analysis and diagnostics for trained recurrent and state-space models.

The public Python API (each name is imported on first use, so ``import gradscope`` and the
command line start fast):

- :func:`load` — a gradscope or paper checkpoint (or a run directory's latest) → :class:`Loaded`;
- :func:`wrap` — a user's ``nn.RNN``/``nn.GRU``/``nn.LSTM`` or protocol core → a model gradscope analyses;
- workflows, one signature shape ``(source, *, options…) → xarray.Dataset`` (a store's variables;
  ``source`` a path, a :class:`Loaded` or a model in memory; options named as the CLI's flags):
  :func:`stability`, :func:`accuracy`, :func:`dynamics`, :func:`summarize` (``source``: stores);
- :func:`text_accuracy` — a pretrained causal LM (a ``save_pretrained`` directory) on raw text:
  perplexity and accuracy by token frequency and position (docs/real-text.md);
- :func:`text_stability`, :func:`text_dynamics` — the same model's gradient stability and dynamics on
  probes drawn from the text, by token frequency (docs/real-text.md); :func:`reproduce_text` all three
  into one folder (``gradscope reproduce --model-dir DIR --text FILE`` adds the report);
- :func:`reproduce` — the whole synthetic or lm study (train vanilla and PE × seeds, accuracy,
  stability, summaries; ``gradscope reproduce`` adds the report), options :class:`StudyOptions`;
- tensor-level functions: :func:`state_jacobian`, :func:`probe_stability`, :func:`lyapunov_spectrum`, and the
  matrix-free products :func:`jvp_products` (J V) and :func:`vjp_products` (U J), which never form J;
- :func:`make_probes`, :func:`frequency_groups`, :class:`Probes` — probe triplets;
- the configs, :class:`GradscopeError` (every user error), ``__version__``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gradscope.errors import GradscopeError
from gradscope.checkout import use_checkout_folders

use_checkout_folders()  # a source checkout's top-level cli/ and reports/ as gradscope.cli and gradscope.reports

if TYPE_CHECKING:  # what editors and type checkers see; at run time each name is imported on first use
    from gradscope.analysis.jacobian import JacobianResult, jvp_products, state_jacobian, vjp_products
    from gradscope.analysis.lyapunov import LyapunovResult, lyapunov_spectrum
    from gradscope.analysis.stability import StabilityResult, probe_stability
    from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
    from gradscope.files.checkpoint import Loaded, load
    from gradscope.models.registry import CORES
    from gradscope.models.wrap import WrappedModel, wrap
    from gradscope.tasks.probes import Probes, frequency_groups, make_probes
    from gradscope.version import __version__
    from gradscope.workflows.accuracy import accuracy
    from gradscope.workflows.dynamics import dynamics
    from gradscope.workflows.stability import stability
    from gradscope.workflows.summarize import summarize
    from gradscope.workflows.text_accuracy import text_accuracy
    from gradscope.workflows.text_probes import text_dynamics, text_stability
    from gradscope.workflows.reproduce import StudyOptions, reproduce
    from gradscope.workflows.text_study import reproduce_text

_EXPORTS = {
    "__version__": "gradscope.version",
    "load": "gradscope.files.checkpoint", "Loaded": "gradscope.files.checkpoint",
    "wrap": "gradscope.models.wrap", "WrappedModel": "gradscope.models.wrap",
    "state_jacobian": "gradscope.analysis.jacobian", "JacobianResult": "gradscope.analysis.jacobian",
    "jvp_products": "gradscope.analysis.jacobian", "vjp_products": "gradscope.analysis.jacobian",
    "probe_stability": "gradscope.analysis.stability", "StabilityResult": "gradscope.analysis.stability",
    "lyapunov_spectrum": "gradscope.analysis.lyapunov", "LyapunovResult": "gradscope.analysis.lyapunov",
    "stability": "gradscope.workflows.stability", "dynamics": "gradscope.workflows.dynamics",
    "accuracy": "gradscope.workflows.accuracy", "summarize": "gradscope.workflows.summarize",
    "text_accuracy": "gradscope.workflows.text_accuracy",
    "text_stability": "gradscope.workflows.text_probes", "text_dynamics": "gradscope.workflows.text_probes",
    "reproduce_text": "gradscope.workflows.text_study",
    "reproduce": "gradscope.workflows.reproduce", "StudyOptions": "gradscope.workflows.reproduce",
    "Probes": "gradscope.tasks.probes", "make_probes": "gradscope.tasks.probes",
    "frequency_groups": "gradscope.tasks.probes",
    "ModelConfig": "gradscope.config", "RunConfig": "gradscope.config", "TaskConfig": "gradscope.config",
    "TrainConfig": "gradscope.config", "CORES": "gradscope.models.registry",
}
__all__ = ["GradscopeError", "__version__", "load", "Loaded", "wrap", "WrappedModel", "state_jacobian",
           "JacobianResult", "jvp_products", "vjp_products", "probe_stability", "StabilityResult", "lyapunov_spectrum",
           "LyapunovResult", "stability", "dynamics", "accuracy", "summarize", "text_accuracy", "text_stability",
           "text_dynamics", "reproduce_text", "reproduce", "StudyOptions", "Probes", "make_probes",
           "frequency_groups",
           "ModelConfig", "RunConfig", "TaskConfig", "TrainConfig", "CORES"]  # GradscopeError and _EXPORTS (tests/test_startup.py)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gradscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
