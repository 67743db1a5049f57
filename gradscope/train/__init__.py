"""Training: the loop, the learning-rate schedule, held-out evaluation, samples and vocabulary extension.
Checkpoints are read and written by :mod:`gradscope.files`."""

from gradscope.train.evaluate import evaluate_heldout, predict
from gradscope.train.extend import extension_config
from gradscope.train.loop import is_run_dir, read_evaluation, read_run_config, train
from gradscope.train.schedule import lr_at

__all__ = ["evaluate_heldout", "extension_config", "is_run_dir", "lr_at", "predict", "read_evaluation",
           "read_run_config", "train"]
