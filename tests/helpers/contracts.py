"""The contract every registered core meets (issue #39 part 3), in the manner of scikit-learn's
``check_estimator``: :func:`check_core` runs a core through every layer — its config and registry line,
training from the command line (and resuming), the checkpoint's loading, its step Jacobian against
float64 autograd, stability, accuracy, dynamics with the plan, summarize and report — on real files.
A new core passes it with nothing but its file and its registry line; no test here names a core.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from typer.testing import CliRunner

import gradscope
from gradscope.cli.app import app
from gradscope.models import CORES, SeqModel
from gradscope.models.core import step_at, step_jacobian
from gradscope.store import read_store

SMALL = ["--vocab-size", "6", "--length", "4", "--embed-size", "4", "--hidden-size", "6", "--iterations", "12",
         "--checkpoint-every", "6", "--heldout-size", "32", "--grid-per-cell", "2", "--batch-size", "8", "-q"]


def _run(runner: CliRunner, args: list[str]) -> None:
    done = runner.invoke(app, args)
    assert done.exit_code == 0, (args[0], done.stderr or done.stdout)


def check_step_jacobian(name: str) -> None:
    """The core's step Jacobian (analytic or generic) equals float64 autograd through its step."""
    from gradscope.config import ModelConfig

    cls = CORES[name]
    torch.manual_seed(0)
    model = SeqModel(ModelConfig(core=name, vocab_size=6, embed_size=4, hidden_size=6,
                                 core_config=dict(cls.tiny_config))).double()
    core = model.core
    with torch.no_grad():
        x = model.core_inputs(torch.tensor([[1, 2, 3]]))[:, 1]
    z = torch.randn(1, core.state_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = step_jacobian(core, x, z, 1)
    want = torch.autograd.functional.jacobian(lambda s: step_at(core, x, s, 1)[1], z)[0, :, 0]
    torch.testing.assert_close(got[0], want, rtol=1e-9, atol=1e-10)


def check_core(name: str, tmp_path: Path) -> None:
    """Every layer on the registered core ``name`` (a key of :data:`gradscope.models.CORES`)."""
    runner = CliRunner()
    assert name in CORES and CORES[name].tiny_config is not None
    check_step_jacobian(name)
    run = tmp_path / "run"
    _run(runner, ["train", "--core", name, *SMALL, "--stop-after", "6", "-o", str(run)])
    _run(runner, ["train", "--resume", str(run), "-q"])  # resumed where it stopped
    loaded = gradscope.load(run)
    assert loaded.iteration == 12 and loaded.config.model.core == name
    assert json.loads((run / "config.json").read_text())["config"]["model"]["core"] == name
    stab, acc, dyn = tmp_path / "stability.zarr", tmp_path / "accuracy.zarr", tmp_path / "dynamics.zarr"
    _run(runner, ["stability", str(run), "--triplets", "3", "-o", str(stab), "-q"])
    _run(runner, ["accuracy", str(run), "-o", str(acc), "-q"])
    _run(runner, ["dynamics", str(run), "--sequences", "2", "--grid-sequences", "1", "--trajectories", "2",
                  "--steps", "30", "--warmup", "5", "--sv", "3", "-o", str(dyn), "-q"])
    s, a, d = read_store(stab), read_store(acc), read_store(dyn, kind="dynamics")
    assert s.sizes["checkpoint"] == 2 and np.isfinite(s["score_default"].values).all()
    assert 0.0 <= float(a["token_accuracy"].values[-1]) <= 1.0
    assert np.isfinite(d["lyapunov"].values[..., 0]).all() and np.isfinite(d["flow_fro"].values[..., :-1]).all()
    _run(runner, ["summarize", str(stab), "--resamples", "50", "-o", str(tmp_path / "summary.zarr")])
    html = tmp_path / "report.html"
    _run(runner, ["report", str(run), str(stab), str(acc), str(dyn), "-o", str(html)])
    assert html.stat().st_size > 100_000
