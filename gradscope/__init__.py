"""gradscope: analysis and diagnostics for trained recurrent and state-space models.

The public Python API (each name is imported on first use, so ``import gradscope`` and the
command line start fast):

- :func:`load` — a gradscope or paper checkpoint (or a run directory's latest) → :class:`Loaded`;
- :func:`wrap` — a user's ``nn.RNN``/``nn.GRU``/``nn.LSTM`` or protocol core → a model gradscope analyses;
- workflows, one signature shape ``(source, *, opts=None, **overrides) → xarray.Dataset`` (a store's variables;
  ``source`` a path, a :class:`Loaded`, a model in memory or :func:`source`; ``opts`` the command's options
  dataclass, ``overrides`` its fields, named as the CLI's flags):
  :func:`stability`, :func:`accuracy`, :func:`dynamics`, :func:`summarize` (``source``: stores);
- :func:`source` — what a command analyses, resolved once: checkpoints, a model in memory, a model factory's
  model, or a transformers model on a raw text (``gradscope.accuracy|stability|dynamics(DIR, model_factory="hf",
  text=FILE)``: its perplexity and accuracy, gradient stability and dynamics by token frequency;
  docs/real-text.md);
  :func:`reproduce_text` accuracy, stability and dynamics of a model on a text into one folder
  (``gradscope reproduce --model-dir DIR --text FILE`` adds the report);
- :func:`train_run` — one training run, as ``gradscope train`` (a preset and settings, ``resume=DIR`` or
  ``extend_from=CHECKPOINT``) → :class:`TrainRun` (its directory, config and held-out evaluation);
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
    from gradscope.workflows.api import accuracy, dynamics, source, stability
    from gradscope.workflows.summarize import summarize
    from gradscope.workflows.study.reproduce import StudyOptions, reproduce
    from gradscope.workflows.text.study import reproduce_text
    from gradscope.workflows.training import TrainRun, train_run

_EXPORTS = {
    "__version__": "gradscope.version",
    "load": "gradscope.files.checkpoint", "Loaded": "gradscope.files.checkpoint",
    "wrap": "gradscope.models.wrap", "WrappedModel": "gradscope.models.wrap",
    "state_jacobian": "gradscope.analysis.jacobian", "JacobianResult": "gradscope.analysis.jacobian",
    "jvp_products": "gradscope.analysis.jacobian", "vjp_products": "gradscope.analysis.jacobian",
    "probe_stability": "gradscope.analysis.stability", "StabilityResult": "gradscope.analysis.stability",
    "lyapunov_spectrum": "gradscope.analysis.lyapunov", "LyapunovResult": "gradscope.analysis.lyapunov",
    "stability": "gradscope.workflows.api", "dynamics": "gradscope.workflows.api", "source": "gradscope.workflows.api",
    "accuracy": "gradscope.workflows.api", "summarize": "gradscope.workflows.summarize",
    "reproduce_text": "gradscope.workflows.text.study",
    "train_run": "gradscope.workflows.training", "TrainRun": "gradscope.workflows.training",
    "reproduce": "gradscope.workflows.study.reproduce", "StudyOptions": "gradscope.workflows.study.reproduce",
    "Probes": "gradscope.tasks.probes", "make_probes": "gradscope.tasks.probes",
    "frequency_groups": "gradscope.tasks.probes",
    "ModelConfig": "gradscope.config", "RunConfig": "gradscope.config", "TaskConfig": "gradscope.config",
    "TrainConfig": "gradscope.config", "CORES": "gradscope.models.registry",
}
__all__ = ["GradscopeError", "__version__", "load", "Loaded", "wrap", "WrappedModel", "state_jacobian",
           "JacobianResult", "jvp_products", "vjp_products", "probe_stability", "StabilityResult", "lyapunov_spectrum",
           "LyapunovResult", "stability", "dynamics", "accuracy", "summarize", "source",
           "reproduce_text", "reproduce", "StudyOptions", "train_run", "TrainRun", "Probes", "make_probes",
           "frequency_groups",
           "ModelConfig", "RunConfig", "TaskConfig", "TrainConfig", "CORES"]  # GradscopeError and _EXPORTS (tests/project/test_startup.py)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gradscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
