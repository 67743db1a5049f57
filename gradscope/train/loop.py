"""The training loop, with exact resume (SPEC §3; run-directory format in the README).

A run directory holds ``config.json``, checkpoints ``step-XXXXXXX.pt`` and ``metrics.jsonl``;
at the end, ``eval.json`` holds the held-out evaluation. Resume restores model, optimizer,
schedule position and the data generator's state, so N steps + resume N steps is bit-identical
to 2N uninterrupted steps on the CPU.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from gradscope.config import RunConfig
from gradscope.errors import GradscopeError, check
from gradscope.models import SeqModel
from gradscope.tasks import Batch, Excluder, HeldOut, Task, build_heldout, make_task, sample_excluding
from gradscope.tasks.base import IGNORE
from gradscope.train.checkpoint import (FORMAT, FORMAT_VERSION, checkpoint_name, heldout_to_dict, list_checkpoints,
                                        load_checkpoint)
from gradscope.train.device import resolve_device
from gradscope.train.evaluate import evaluate_heldout
from gradscope.train.io import atomic_save, atomic_write_text
from gradscope.train.schedule import lr_at
from gradscope.version import __version__

CONFIG_FILE, METRICS_FILE, EVAL_FILE = "config.json", "metrics.jsonl", "eval.json"
RUN_FORMAT = "gradscope-run"

StepCallback = Callable[[int, "dict[str, float] | None"], None]


@dataclass
class TrainState:
    """Everything that changes while training (the config does not)."""

    model: SeqModel
    optimizer: torch.optim.Adam
    data_gen: torch.Generator
    heldout: HeldOut
    iteration: int
    window: torch.Tensor  # (3,) loss sum, correct, scored since the last log line
    window_steps: int


def is_run_dir(path: Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


def resumable(run_dir: Path) -> bool:
    """True when the run directory holds a training checkpoint to resume from."""
    return any(p.name.startswith("step-") for p in list_checkpoints(run_dir))


def discard_unstarted(run_dir: Path) -> None:
    """Make a run killed before its first checkpoint startable again. Such a directory holds only
    its config, a few log lines and perhaps a temporary file of an interrupted write; a fresh start
    redoes all of it, so nothing is lost. Anything else in the directory is refused, not deleted."""
    run_dir = Path(run_dir)
    others = sorted(p.name for p in run_dir.iterdir()
                    if p.name not in (CONFIG_FILE, METRICS_FILE) and not (p.name.startswith(".") and p.name.endswith(".tmp")))
    check(not others, f"run directory: {run_dir} has no checkpoint to resume from but holds {', '.join(others)}; "
                      f"move it away to start the run again")
    for p in run_dir.iterdir():
        p.unlink()


def read_run_config(run_dir: Path) -> RunConfig:
    path = Path(run_dir) / CONFIG_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise GradscopeError(f"resume: {run_dir} is not a gradscope run ({CONFIG_FILE}: {exc})") from None
    if data.get("format") != RUN_FORMAT:
        raise GradscopeError(f"resume: {path} is not a gradscope run config")
    return RunConfig.from_dict(data["config"])


def _fresh_state(cfg: RunConfig, device: torch.device) -> TrainState:
    heldout = build_heldout(make_task(cfg.task), cfg.train.seed)
    torch.manual_seed(cfg.train.seed)  # model initialisation is seeded
    model = SeqModel(cfg.model).to(device)
    optimizer = _optimizer(cfg, model)
    gen = torch.Generator(device=device).manual_seed(cfg.train.seed + 1)
    return TrainState(model, optimizer, gen, heldout, 0, torch.zeros(3, device=device), 0)


def _optimizer(cfg: RunConfig, model: SeqModel) -> torch.optim.Adam:
    t = cfg.train
    return torch.optim.Adam(model.parameters(), lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=0.0)


def _checkpoint(cfg: RunConfig, state: TrainState, metrics: dict[str, float]) -> dict[str, Any]:
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "gradscope_version": __version__,
        "torch_version": str(torch.__version__), "config": cfg.to_dict(), "iteration": state.iteration,
        "model": state.model.state_dict(), "optimizer": state.optimizer.state_dict(),
        "scheduler": {"name": "warmup-cosine", "iteration": state.iteration},
        "rng": {"data": state.data_gen.get_state(), "data_device": str(state.data_gen.device),
                "torch": torch.get_rng_state()},
        "heldout": heldout_to_dict(state.heldout), "metrics": metrics,
        "log_window": {"sums": state.window.detach().cpu(), "steps": state.window_steps},
    }


def _resumed_state(cfg: RunConfig, run_dir: Path, device: torch.device) -> TrainState:
    found = [p for p in list_checkpoints(run_dir) if p.name.startswith("step-")]
    if not found:
        raise GradscopeError(f"resume: {run_dir} has no checkpoint yet; start it again without --resume "
                             f"after removing the directory")
    loaded = load_checkpoint(found[-1])
    raw = loaded.raw
    if raw.get("stripped"):
        raise GradscopeError(f"resume: {found[-1]} is a stripped sample checkpoint (no optimizer state); it can be "
                             f"analysed but not resumed")
    model = loaded.model.to(device).train()
    optimizer = _optimizer(cfg, model)
    optimizer.load_state_dict(raw["optimizer"])
    gen = torch.Generator(device=device)
    if raw["rng"]["data_device"] != str(gen.device):
        raise GradscopeError(f"resume: the run's data generator lives on {raw['rng']['data_device']}, "
                             f"but this run would use {gen.device}; resume on the same device")
    gen.set_state(raw["rng"]["data"])
    torch.set_rng_state(raw["rng"]["torch"])
    window = raw["log_window"]
    return TrainState(model, optimizer, gen, loaded.heldout, loaded.iteration, window["sums"].to(device),
                      int(window["steps"]))


def _truncate_metrics(path: Path, iteration: int) -> None:
    """Keep the metrics lines up to ``iteration`` (work after the last checkpoint is redone)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["iteration"] <= iteration:
                kept.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut short by a kill
    atomic_write_text(path, "".join(f"{line}\n" for line in kept))


def loss_and_correct(model: SeqModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training objective on one batch: (mean cross-entropy over scored positions, # right, # scored)."""
    logits = model(batch.inputs)  # (B, T, K)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE)
    scored = batch.targets != IGNORE
    correct = ((logits.argmax(-1) == batch.targets) & scored).sum()
    return loss, correct, scored.sum()


def train(cfg: RunConfig, run_dir: Path, *, resume: bool = False, stop_after: int | None = None,
          on_step: StepCallback | None = None, command: str = "") -> dict[str, Any]:
    """Train (or resume) the run in ``run_dir``; returns the held-out evaluation when finished
    (an empty dict if ``stop_after`` stopped it early). ``on_step(iteration, log)`` is called after
    every iteration, with the logged metrics on logging iterations and None otherwise."""
    run_dir = Path(run_dir)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    device = resolve_device(cfg.train.device)
    if resume:
        state = _resumed_state(cfg, run_dir, device)
        _truncate_metrics(run_dir / METRICS_FILE, state.iteration)
    else:
        if run_dir.exists() and any(run_dir.iterdir()):
            raise GradscopeError(f"run directory: {run_dir} already exists and is not empty; pass --resume "
                                 f"to continue it, or choose a new directory")
        check_fits(cfg, make_task(cfg.task))
        state = _fresh_state(cfg, device)
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / CONFIG_FILE, json.dumps(
            {"format": RUN_FORMAT, "format_version": FORMAT_VERSION, "gradscope_version": __version__,
             "command": command, "config": cfg.to_dict()}, indent=2) + "\n")
    task = make_task(cfg.task)
    excluder = Excluder(state.heldout.exclusion_rows(task)).to(device)
    t = cfg.train
    end = t.iterations if stop_after is None else min(t.iterations, state.iteration + stop_after)
    model, opt = state.model.train(), state.optimizer
    tic, tic_steps = time.perf_counter(), 0
    last: dict[str, float] = {}
    # enable_grad: never inherit a caller's (or an earlier task on this worker thread's) no_grad
    with open(run_dir / METRICS_FILE, "a") as log, torch.enable_grad():
        while state.iteration < end:
            lr = lr_at(state.iteration, t.lr, t.warmup, t.iterations)
            for group in opt.param_groups:
                group["lr"] = lr
            batch = sample_excluding(task, t.batch_size, state.data_gen, excluder)
            loss, correct, scored = loss_and_correct(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if t.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip)
            opt.step()
            state.iteration += 1
            state.window += torch.stack([loss.detach(), correct.float(), scored.float()])
            state.window_steps += 1
            tic_steps += 1
            entry = None
            # log on a fixed cadence only, so a stopped-and-resumed run writes the same log
            if state.iteration % t.log_every == 0 or state.iteration == t.iterations:
                loss_sum, n_correct, n_scored = state.window.tolist()
                elapsed = time.perf_counter() - tic
                entry = {"iteration": state.iteration, "loss": loss_sum / state.window_steps,
                         "accuracy": n_correct / max(n_scored, 1), "lr": lr,
                         "tokens_per_s": tic_steps * t.batch_size * task.total_len / max(elapsed, 1e-9)}
                log.write(json.dumps(entry) + "\n")
                log.flush()
                last = {"loss": entry["loss"], "accuracy": entry["accuracy"]}
                state.window.zero_()
                state.window_steps, tic, tic_steps = 0, time.perf_counter(), 0
            if state.iteration % t.checkpoint_every == 0 or state.iteration == end:
                atomic_save(_checkpoint(cfg, state, last), run_dir / checkpoint_name(state.iteration))
            if on_step is not None:
                on_step(state.iteration, entry)
    if state.iteration < t.iterations:
        return {}
    result = {"iteration": state.iteration, **evaluate_heldout(model, task, state.heldout)}
    atomic_write_text(run_dir / EVAL_FILE, json.dumps(result, indent=2) + "\n")
    return result


def check_fits(cfg: RunConfig, task: Task) -> None:
    """The model must cover the task: same number of classes, PE table long enough."""
    check(cfg.model.vocab_size == task.num_classes,
          f"model vocab_size: got {cfg.model.vocab_size}; the task needs {task.num_classes} classes")
    check(cfg.model.max_len >= task.total_len,
          f"max_len: got {cfg.model.max_len}; the task's sequences are {task.total_len} steps long")
