"""The SPEC's defaults, pinned where each one lives: configs, presets, the statistics and stability
workflows, the sweep spec, and the command-line options. A change to any of them is a change to
the science and must be made here too, on purpose."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import torch
from typer.main import get_command

import gradscope
from tests.helpers.runs import small_run
from gradscope.analysis import bootstrap
from gradscope.cli.app import app
from gradscope.config import TaskConfig, TrainConfig
from gradscope.presets import PRESETS, build_config, scale_configs
from gradscope.train import train
from gradscope.workflows import stability as stability_workflow
from gradscope.workflows import summarize as summarize_workflow
from gradscope.workflows.stability import StabilityOptions
from gradscope.workflows.sweep.grid import parse_spec


def _default(fn: object, name: str) -> object:
    return inspect.signature(fn).parameters[name].default


def _cli_default(command: str, name: str) -> object:
    cmd = get_command(app).commands[command]  # get_params: train's settings are generated per call
    params = {p.name: p for p in cmd.get_params(cmd.make_context(command, [], resilient_parsing=True))}
    return params[name].default


def test_spec_defaults() -> None:
    task, opt = TaskConfig(), TrainConfig()
    paper = [PRESETS["paper"], *scale_configs("paper").values()]

    # SPEC §3, vocabulary: "each position is Rare with probability rarity (reference code default 1/8)"
    assert task.rarity == 0.125
    assert build_config("tiny", {}).task.rarity == 0.125  # `gradscope train` without --rarity
    assert build_config("paper", {"distribution": "dual"}).task.rarity == 0.125
    assert all(cfg.task.rarity == 0.125 for cfg in paper)

    # SPEC §3, training (paper): Adam (β1, β2) = (0.9, 0.999), no weight decay, lr 1e-3 warmed up
    # linearly over 1000 iterations then cosine, batch 512, 300k iterations, clip 1.0, checkpoints every 5000
    assert tuple(opt.betas) == (0.9, 0.999)
    assert opt.clip == 1.0
    assert (opt.warmup, opt.batch_size, opt.lr, opt.iterations, opt.checkpoint_every) == (1000, 512, 1e-3, 300_000, 5000)
    for cfg in paper:
        t = cfg.train
        assert tuple(t.betas) == (0.9, 0.999), cfg
        assert t.clip == 1.0, cfg
        assert (t.warmup, t.batch_size, t.lr, t.iterations, t.checkpoint_every) == (1000, 512, 1e-3, 300_000, 5000)
    for preset in PRESETS:  # --beta1/--beta2/--clip not given: the SPEC's values
        t = build_config(preset, {}).train
        assert tuple(t.betas) == (0.9, 0.999), preset
        assert t.clip == 1.0, preset
    assert _cli_default("train", "beta1") is None and _cli_default("train", "beta2") is None
    assert _cli_default("train", "clip") is None and _cli_default("train", "rarity") is None

    # SPEC §3, held-out data: 1024 uniform sequences; the grid has N = 16 per (group, group, position)
    assert (task.heldout_size, task.grid_per_cell) == (1024, 16)
    assert all((cfg.task.heldout_size, cfg.task.grid_per_cell) == (1024, 16) for cfg in paper)

    # SPEC §5: 95% confidence intervals from 10,000 bootstrap resamples
    assert _default(bootstrap.confidence_interval, "resamples") == 10_000
    assert _default(bootstrap.confidence_interval, "confidence") == 0.95
    assert _default(bootstrap.bootstrap_mean, "resamples") == 10_000
    assert _default(summarize_workflow.summarize_groups, "resamples") == 10_000
    assert _default(stability_workflow.summarize, "resamples") == 10_000
    for command in ("stability", "summarize", "report"):
        assert _cli_default(command, "resamples") == 10_000, f"gradscope {command} --resamples"
    assert _cli_default("summarize", "ci") == 0.95

    # SPEC §4: target position p = 1 for every core
    assert StabilityOptions().target_pos == 1
    assert StabilityOptions().target_pos == 1 and "target_pos" not in inspect.signature(gradscope.stability).parameters
    assert _cli_default("stability", "target_pos") == 1
    spec = parse_spec('[axes]\nseed = [1]\n[stability]\ntriplets = 2\n')
    assert spec.analyses.stability is not None
    assert spec.analyses.stability.target_pos == 1


def test_the_optimizer_is_built_with_the_configured_adam_settings(tmp_path: Path) -> None:
    """SPEC §3 betas reach the optimizer the loop builds (no weight decay); a non-default pair too."""
    for betas in ((0.9, 0.999), (0.9, 0.98)):
        cfg = small_run(iterations=5)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, betas=betas, eps=1e-9))
        run = tmp_path / f"b{betas[1]}"
        train(cfg, run)
        group = gradscope.load(run).raw["optimizer"]["param_groups"][0]
        assert tuple(group["betas"]) == betas and group["eps"] == 1e-9 and group["weight_decay"] == 0.0


@pytest.mark.parametrize("clip", [0.1, 0.0])
def test_the_loop_clips_the_gradient_norm_to_the_configured_value(clip: float, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The clip value (SPEC §3: 1.0, pinned above) reaches the loop: every step's gradient is clipped
    to that norm (0 disables clipping). 0.1 is below this small model's gradient norms (≈ 0.4–0.6)."""
    norms: list[float] = []
    step = torch.optim.Adam.step

    def recording(self: torch.optim.Optimizer, *args: object, **kwargs: object) -> object:
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", recording)
    cfg = small_run(iterations=5)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, clip=clip))
    train(cfg, tmp_path / "run")
    assert len(norms) == 5
    if clip:
        assert max(norms) <= clip * (1 + 1e-5)
    else:
        assert min(norms) > 0.1  # unclipped, every step is above 0.1: clipping to 0.1 shows
