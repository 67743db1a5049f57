"""Models: embedding + positional encoding + a registered core + logits, and wrappers for a user's
own recurrent modules."""

from gradscope.models.config import ModelConfig, model_fields
from gradscope.models.core import Core, scan
from gradscope.models.elman import ElmanCore
from gradscope.models.gru import GRUCore
from gradscope.models.lstm import LSTMCore
from gradscope.models.pe import SinusoidalPE, TablePE, build_pe, sinusoidal_frequencies
from gradscope.models.registry import CORES, core_class
from gradscope.models.rnn import RNNCore
from gradscope.models.s4d import S4DBlock, S4DConfig, S4DCore, S4DKernel
from gradscope.models.seq import SeqModel, build_core

__all__ = ["CORES", "Core", "ElmanCore", "GRUCore", "LSTMCore", "ModelConfig", "RNNCore", "S4DBlock", "S4DConfig",
           "S4DCore", "S4DKernel", "SeqModel", "SinusoidalPE", "TablePE", "build_core", "build_pe", "core_class",
           "model_fields", "scan", "sinusoidal_frequencies"]
