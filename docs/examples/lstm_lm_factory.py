"""A model factory for ``gradscope stability CKPT --model-factory docs/examples/lstm_lm_factory.py:build``.

The checkpoint is a plain ``state_dict`` of the small language model below (Embedding → 2-layer
nn.LSTM → Linear), saved with ``torch.save(model.state_dict(), path)``. ``build`` rebuilds the
model, loads the weights with ``weights_only=True`` (no code runs from the checkpoint) and hands
gradscope the LSTM itself, with the embedding as its input map and the head as its readout.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import gradscope


class LanguageModel(nn.Module):
    def __init__(self, vocab: int = 12, embed: int = 6, hidden: int = 8, layers: int = 2) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embedding(tokens))[0])  # (B, T, vocab) next-token logits


def build(checkpoint: Path) -> "gradscope.WrappedModel":
    model = LanguageModel()
    model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    model.eval()
    return gradscope.wrap(model.lstm, inputs=model.embedding, readout=model.head)
