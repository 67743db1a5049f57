"""Models: embedding + positional encoding + core (elman, gru, lstm, s4d) + logits."""

from gradscope.models.core import Core
from gradscope.models.pe import SinusoidalPE, TablePE, build_pe, sinusoidal_frequencies
from gradscope.models.rnn import CELLS, RNNCore
from gradscope.models.s4d import S4DBlock, S4DCore, S4DKernel
from gradscope.models.seq import SeqModel, build_core

__all__ = ["CELLS", "Core", "RNNCore", "S4DBlock", "S4DCore", "S4DKernel", "SeqModel", "SinusoidalPE",
           "TablePE", "build_core", "build_pe", "sinusoidal_frequencies"]
