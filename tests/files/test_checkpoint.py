"""Checkpoint formats: gradscope's own and the paper's public code (SPEC §6); safe loading."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import gradscope
from tests.helpers.runs import OTHER_CORE, small_run
from gradscope.errors import GradscopeError
from gradscope.tasks import grid_batch
from gradscope.train import train


def test_gradscope_checkpoint_round_trip(tmp_path: Path) -> None:
    cfg = small_run(OTHER_CORE, pe="learnable", iterations=10)
    train(cfg, tmp_path / "run")
    loaded = gradscope.load(tmp_path / "run")
    assert loaded.source == "gradscope" and loaded.iteration == 10 and loaded.config == cfg
    assert loaded.heldout.grid is not None and loaded.heldout.grid.shape == (2, 2, 2, 4, 4)
    assert loaded.heldout.uniform.inputs.shape == (64, 8)
    first = gradscope.load(tmp_path / "run" / "step-0000005.pt")
    assert first.iteration == 5
    assert not torch.equal(first.model.to_logits.weight, loaded.model.to_logits.weight)
    umask = os.umask(0)
    os.umask(umask)
    for name in ("config.json", "step-0000010.pt", "eval.json"):  # atomic writes keep the usual permissions
        assert (tmp_path / "run" / name).stat().st_mode & 0o777 == 0o666 & ~umask


def _paper_checkpoint(path: Path, rnn_name: str, grid: bool) -> tuple[dict, torch.Tensor]:
    """A file in exactly the layout the paper's code saves (SPEC §6), built from plain nn modules."""
    torch.manual_seed(11)
    K, E, H, L = 6, 4, 5, 3
    emb = nn.Embedding(K + 1, E)
    rnn = {"GRU": nn.GRU, "LSTM": nn.LSTM, "RNN": nn.RNN}[rnn_name](2 * E, H, batch_first=True)
    to_logits = nn.Linear(H, K)
    freqs = torch.exp(torch.arange(0, E, 2) * (-math.log(10000.0) / E))
    sd = {"embedding.weight": emb.weight.detach(), "time_encoder.frequencies": freqs,
          **{f"rnn.{k}": v.detach() for k, v in rnn.state_dict().items()},
          **{f"to_logits.{k}": v.detach() for k, v in to_logits.state_dict().items()}}
    held = torch.randint(0, K, (2, 2, 3, L, L) if grid else (10, L))
    ckpt = {"modules": {"rnn": {"module_name": "RNN", "state_dict": sd, "init_args": {
        "vocab_size": K, "hidden_size": H, "rnn_name": rnn_name, "embed_size": E, "time_encoding": "concat",
        "time_encoding_form": "sinusoidal", "max_length": 2 * L, "num_layers": 1, "dropout": 0.0,
        "learnable_padding_token": False}}},
        "optimizer": {}, "scheduler": {}, "random_seed": 111, "iteration": 999, "held_out_data": held}
    torch.save(ckpt, path)
    # the reference forward pass, computed here independently of gradscope
    tokens = torch.cat([held.reshape(-1, L)[:4], torch.full((4, L), K)], dim=1)
    t = torch.arange(2 * L)[:, None] * freqs[None, :]
    pe = torch.cat([t.sin(), t.cos()], dim=-1) / math.sqrt(E / 2)
    x = torch.cat([emb(tokens), pe.expand(4, -1, -1)], dim=-1)
    with torch.no_grad():
        expected = to_logits(rnn(x)[0])
    return ckpt, expected


@pytest.mark.parametrize("rnn_name", ["GRU", "LSTM", "RNN"])
@pytest.mark.parametrize("grid", [True, False])
def test_paper_checkpoint_loads_and_computes_the_same(tmp_path: Path, rnn_name: str, grid: bool) -> None:
    path = tmp_path / "checkpoint_after-1000-iters.pt"
    _, expected = _paper_checkpoint(path, rnn_name, grid)
    loaded = gradscope.load(path)
    assert loaded.source == "paper" and loaded.iteration == 1000
    assert loaded.config.model.core == {"GRU": "gru", "LSTM": "lstm", "RNN": "elman"}[rnn_name]
    assert loaded.config.model.pe == "sinusoidal" and loaded.config.train.seed == 111
    if grid:
        assert loaded.heldout.grid.shape == (2, 2, 3, 3, 3)
        inputs = grid_batch(loaded_task(loaded), loaded.heldout.grid).inputs[:4]
    else:
        inputs = loaded.heldout.uniform.inputs[:4]
    with torch.no_grad():
        got = loaded.model(inputs)
    assert torch.allclose(got, expected, atol=1e-6)
    # a run directory with paper-named checkpoints resolves too
    assert gradscope.load(tmp_path).iteration == 1000


def loaded_task(loaded: gradscope.Loaded):  # noqa: ANN201
    from gradscope.tasks import make_task
    return make_task(loaded.config.task)


def test_paper_s4d_checkpoint_loads(tmp_path: Path) -> None:
    from gradscope.config import ModelConfig
    from gradscope.models import SeqModel
    torch.manual_seed(12)
    ours = SeqModel(ModelConfig(core="s4d", vocab_size=6, embed_size=4, hidden_size=5, num_layers=2, core_config={"state_size": 8}))
    sd = {k.replace("core.", "", 1): v for k, v in ours.state_dict().items()}
    assert "ssm.1.kernel.log_A_real" in sd and "in_proj.weight" in sd
    ckpt = {"modules": {"ssm": {"module_name": "SSM", "init_args": {"vocab_size": 6}, "state_dict": sd}},
            "random_seed": 1, "iteration": 4, "held_out_data": torch.randint(0, 6, (5, 3))}
    torch.save(ckpt, tmp_path / "checkpoint_after-5-iters.pt")
    loaded = gradscope.load(tmp_path / "checkpoint_after-5-iters.pt")
    assert loaded.config.model.core == "s4d" and loaded.config.model.num_layers == 2
    assert loaded.config.model.core_config.state_size == 8
    tokens = loaded.heldout.uniform.inputs
    assert torch.allclose(loaded.model(tokens), ours(tokens), atol=1e-6)


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - a pickle that runs code when unpickled
        return (os.system, (f"touch {self.marker}",))


def test_code_running_pickle_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "PWNED"
    torch.save({"format": "gradscope-checkpoint", "x": _Payload(marker)}, tmp_path / "evil.pt")
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # must not re-enable unsafe loading
    with pytest.raises(GradscopeError, match="refused.*not plain data"):
        gradscope.load(tmp_path / "evil.pt")
    assert not marker.exists()


def test_truncated_and_foreign_files_get_clear_errors(tmp_path: Path) -> None:
    train(small_run(iterations=5), tmp_path / "run")
    data = (tmp_path / "run" / "step-0000005.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(GradscopeError, match="cannot read .*truncated"):
        gradscope.load(tmp_path / "cut.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(GradscopeError, match="cannot read"):
        gradscope.load(tmp_path / "text.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(GradscopeError, match="not a gradscope checkpoint"):
        gradscope.load(tmp_path / "other.pt")
    with pytest.raises(GradscopeError, match="does not exist"):
        gradscope.load(tmp_path / "missing.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GradscopeError, match="no checkpoints"):
        gradscope.load(tmp_path / "empty")
