"""The sequence model around a core: its query token has its own embedding row (SPEC §2). Its cores and
positional encodings are tested in tests/models/test_rnn.py, test_s4d.py and test_pe.py, which build their
models here (_model)."""

from __future__ import annotations

import torch

from gradscope.models import SeqModel

from tests.helpers.cores import tiny_config


def _model(core: str, pe: str = "none", layers: int = 1, combine: str = "concat", seed: int = 0) -> SeqModel:
    torch.manual_seed(seed)
    return SeqModel(tiny_config(core, 9, 6, 10, layers, pe, max_len=40, combine=combine))


def test_query_token_row_exists() -> None:
    model = _model("lstm")
    assert model.embedding.num_embeddings == 10 and model.query_token == 9
    assert model(torch.full((1, 3), 9)).shape == (1, 3, 9)
