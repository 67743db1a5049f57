"""Recurrent cores built on the fused ``nn.RNN/GRU/LSTM`` modules, with a functional twin.

Training runs the fused module; analysis calls :meth:`RNNCore.step`, which re-implements the same
cell from the same weights on a flat real state z (all layers concatenated; LSTM layers hold
concat(h, c)), so torch.func can differentiate it.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from gradscope.models.core import Core

from gradscope.models.elman import elman_cell
from gradscope.models.gru import gru_cell
from gradscope.models.lstm import lstm_cell

Cell = Callable[..., tuple[torch.Tensor, torch.Tensor]]

FUSED: dict[str, type[nn.RNNBase]] = {"elman": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}
CELLS: dict[str, Cell] = {"elman": elman_cell, "gru": gru_cell, "lstm": lstm_cell}


class RNNCore(Core):
    """A stack of ``num_layers`` Elman/GRU/LSTM layers. Attribute name ``rnn`` matches the paper."""

    def __init__(self, kind: str, input_size: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.kind = kind
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.rnn = FUSED[kind](input_size, hidden_size, num_layers, batch_first=True)
        self.cell = CELLS[kind]
        self.layer_state = hidden_size * (2 if kind == "lstm" else 1)

    @property
    def state_dim(self) -> int:
        """D: real width of the full recurrent state z."""
        return self.layer_state * self.num_layers

    @property
    def out_dim(self) -> int:
        return self.hidden_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Fused path. x (B, T, in) → top-layer hidden states (B, T, H)."""
        y, _ = self.rnn(x)
        return y

    def layer_weights(self, layer: int) -> tuple[torch.Tensor, ...]:
        """(W_ih, W_hh, b_ih, b_hh) of one layer."""
        return tuple(getattr(self.rnn, f"{n}_l{layer}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))


    def step(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Functional step. x (B, in), z (B, D) → (top output (B, H), z' (B, D))."""
        parts = z.split(self.layer_state, dim=-1)
        new = []
        inp = x
        for layer, part in enumerate(parts):
            inp, state = self.cell(inp, part, *self.layer_weights(layer))
            new.append(state)
        return inp, torch.cat(new, dim=-1)
