"""Pure tensor analysis functions: accuracy, Jacobians, stability scores, statistics."""

from gradscope.analysis.accuracy import (grid_target_accuracy, position_accuracy, sequence_accuracy, token_accuracy,
                                         token_correct)
from gradscope.analysis.jacobian import METHODS, JacobianResult, state_jacobian
from gradscope.analysis.scores import SCORES, companion_stats, similarity, singular_values, wirtinger
from gradscope.analysis.stability import PAIRS, StabilityResult, probe_stability

__all__ = ["METHODS", "PAIRS", "SCORES", "JacobianResult", "StabilityResult", "companion_stats",
           "grid_target_accuracy", "position_accuracy", "probe_stability", "sequence_accuracy", "similarity",
           "singular_values", "state_jacobian", "token_accuracy", "token_correct", "wirtinger"]
