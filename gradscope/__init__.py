"""gradscope: analysis and diagnostics for trained sequence-model checkpoints."""

from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.errors import GradscopeError
from gradscope.train.checkpoint import Loaded, load
from gradscope.version import __version__

__all__ = ["GradscopeError", "Loaded", "ModelConfig", "RunConfig", "TaskConfig", "TrainConfig", "__version__", "load"]
