"""Training: loop, schedule, evaluation, samples. Checkpoint I/O lives in :mod:`gradscope.files`;
its names are re-exported here for old imports."""

from gradscope.files.checkpoint import (Loaded, checkpoint_name, list_checkpoints, load, load_checkpoint,
                                        resolve_checkpoints, validate_checkpoint)
from gradscope.train.evaluate import evaluate_heldout, predict
from gradscope.files.lock import run_lock
from gradscope.train.extend import extension_config
from gradscope.train.loop import is_run_dir, read_evaluation, read_run_config, train
from gradscope.train.schedule import lr_at

__all__ = ["Loaded", "checkpoint_name", "evaluate_heldout", "extension_config", "is_run_dir", "list_checkpoints", "load",
           "load_checkpoint", "lr_at", "predict", "read_evaluation", "read_run_config", "resolve_checkpoints",
           "run_lock", "train", "validate_checkpoint"]
