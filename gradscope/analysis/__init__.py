"""Pure tensor analysis functions: accuracy, Jacobians, stability scores, statistics."""

from gradscope.analysis.accuracy import (grid_target_accuracy, position_accuracy, sequence_accuracy, token_accuracy,
                                         token_correct)

__all__ = ["grid_target_accuracy", "position_accuracy", "sequence_accuracy", "token_accuracy", "token_correct"]
