"""Adding a core is one file, one registry line and one test (issue #14): a core written here — a
linear RNN z' = W z + U x with its own config — is registered with one line and then configures,
builds, trains, is labelled in reports, and has its Jacobian (vjp and func engines) equal to the
closed form W^(T−p) (SPEC §4 oracle)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import Tensor, nn

from gradscope.analysis.jacobian import state_jacobian
from gradscope.config import ModelConfig, RunConfig
from gradscope.models import CORES, Core, SeqModel
from gradscope.fields import option
from gradscope.store.inputs import model_label


@dataclass(frozen=True)
class LinearConfig:
    scale: float = option(0.9, "Spectral radius of W at initialisation.", short="ρ", alias="radius", low=0.0)


class LinearCore(Core):
    """The whole "one file": parameters, fused forward, functional step, readout, config."""

    name: ClassVar[str] = "linear"
    label: ClassVar[str] = "Linear RNN"
    Config: ClassVar[type] = LinearConfig

    def __init__(self, input_size: int, hidden: int, scale: float) -> None:
        super().__init__()
        self.W = nn.Parameter(scale * torch.linalg.qr(torch.randn(hidden, hidden))[0])
        self.U = nn.Parameter(torch.randn(hidden, input_size) / input_size ** 0.5)
        self.state_dim = self.out_dim = hidden

    @classmethod
    def build(cls, input_size: int, hidden_size: int, num_layers: int, config: LinearConfig) -> "LinearCore":
        return cls(input_size, hidden_size, config.scale)

    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        z = z @ self.W.T + x @ self.U.T
        return z, z

    def readout(self, x: Tensor, z: Tensor) -> Tensor:
        return z

    def forward(self, x: Tensor) -> Tensor:
        return self.scan(x)[0]


def test_a_new_core_is_one_registry_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(CORES, "linear", LinearCore)  # the one registry line
    torch.manual_seed(0)
    cfg = ModelConfig(core="linear", vocab_size=5, embed_size=4, hidden_size=6, core_config={"scale": 1.1})
    assert cfg.core_config == LinearConfig(1.1)
    assert RunConfig.from_dict(RunConfig(model=cfg).to_dict()).model == cfg  # round-trips like any config
    model = SeqModel(cfg).double()
    tokens = torch.randint(0, 6, (3, 8), generator=torch.Generator().manual_seed(1))
    W = model.core.W.detach()
    for p in (2, 8):
        expected = torch.linalg.matrix_power(W, 8 - p).expand(3, -1, -1)
        for method in ("auto", "vjp", "func"):
            res = state_jacobian(model, tokens, p, method=method)
            assert res.method != "analytic"  # the core offers none, so auto falls back to vjp
            assert torch.allclose(res.jac, expected, atol=1e-12), (p, method)
    loss = model(tokens).logsumexp(-1).mean()  # trains: gradients reach its parameters
    loss.backward()
    assert model.core.W.grad is not None and model.core.W.grad.abs().sum() > 0
    assert model_label({"core": "linear", "pe": "none"}) == "Linear RNN vanilla"


def test_a_registered_core_runs_through_every_command(monkeypatch: pytest.MonkeyPatch, runner, tmp_path) -> None:
    """The same one line, and nothing else: `gradscope train` offers its option (--scale, from its
    config's metadata), and stability, dynamics, summarize (grouped by its option's alias) and
    report all run on it, with its label and its option's short name."""
    import json

    from gradscope.cli.app import app

    monkeypatch.setitem(CORES, "linear", LinearCore)  # the one registry line
    assert "--scale" in runner.invoke(app, ["train", "--help"]).stdout
    small = ["--core", "linear", "--vocab-size", "6", "--length", "4", "--embed-size", "4", "--hidden-size", "6", "--iterations", "20",
             "--checkpoint-every", "10", "--heldout-size", "32", "--grid-per-cell", "2", "--batch-size", "8", "-q"]
    runs = {}
    for scale in ("0.5", "0.95"):
        runs[scale] = tmp_path / f"run-{scale}"
        done = runner.invoke(app, ["train", *small, "--scale", scale, "-o", str(runs[scale])])
        assert done.exit_code == 0, done.stderr
        assert json.loads((runs[scale] / "config.json").read_text())["config"]["model"]["core_config"] == {"scale": float(scale)}
    bad = runner.invoke(app, ["train", *small, "--scale", "x", "-o", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "--scale" in bad.stderr and "Traceback" not in bad.stderr
    stores = []
    for scale, run in runs.items():
        st = tmp_path / f"st-{scale}.zarr"
        done = runner.invoke(app, ["stability", str(run), "-o", str(st), "-q", "--triplets", "4", "--resamples", "100"])
        assert done.exit_code == 0, done.stderr
        stores.append(st)
    dyn = tmp_path / "dyn.zarr"
    done = runner.invoke(app, ["dynamics", str(runs["0.5"]), "-o", str(dyn), "--sequences", "2", "--grid-sequences",
                               "2", "--trajectories", "2", "--steps", "30", "--lyap-warmup", "5", "--sv", "3", "-q"])
    assert done.exit_code == 0, done.stderr
    summary = runner.invoke(app, ["summarize", *map(str, stores), "--by", "model,radius", "--resamples", "100"])
    assert summary.exit_code == 0, summary.stderr
    assert "0.5" in summary.stdout and "0.95" in summary.stdout
    html = tmp_path / "r.html"
    done = runner.invoke(app, ["report", *map(str, stores), str(dyn), "-o", str(html)])
    assert done.exit_code == 0, done.stderr
    text = html.read_text()
    assert "Linear RNN vanilla" in text and "ρ=0.5" in text


def test_the_docs_core_example_runs_as_printed() -> None:
    """docs/cores.md's example: registered at run time, its Jacobian is W^(T−p) (the block asserts it)."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "cores.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if 'CORES["linear"] = ' in b]
    assert len(blocks) == 1  # the page's core example (its task-family example is tests/project/test_docs.py's)
    exec(compile(blocks[0], "docs/cores.md", "exec"), {})  # noqa: S102 - the project's own docs
    assert "linear" not in CORES  # the example unregisters itself
