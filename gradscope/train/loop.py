"""The training loop, with exact resume (docs/definitions.md §3; run-directory format in the README).

A run directory holds ``config.json``, checkpoints ``step-XXXXXXX.pt`` and ``metrics.jsonl``;
at the end, ``eval.json`` holds the held-out evaluation. Resume restores model, optimizer,
schedule position, the data generator's state and the last logged metrics, so N steps + resume
N steps writes the same checkpoints, bit for bit in every field, as 2N uninterrupted steps on the
CPU.

One process at a time trains a run directory (:func:`gradscope.files.lock.run_lock`). Every run
first removes the temporaries a killed run left in it, and validates everything it reads (options
and sizes against memory; on resume, every file of the directory) before it writes anything.
"""

from __future__ import annotations

import errno
import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

import torch

from gradscope.config import DECODING, RunConfig
from gradscope.errors import GradscopeError, check
from gradscope.fields import as_int
from gradscope.files.publish import WRITE_ERRORS, disk_error, remove_stale_temporaries
from gradscope.models import SeqModel, core_class
from gradscope.tasks.decoding import decode_logits, teacher_inputs
from gradscope.tasks import Batch, Excluder, HeldOut, Task, build_heldout, make_task, sample_excluding
from gradscope.files.checkpoint import (FORMAT, FORMAT_VERSION, checkpoint_name, heldout_to_dict, list_checkpoints,
                                        load_checkpoint)
from gradscope.train.device import resolve_device
from gradscope.train.evaluate import evaluate_heldout
from gradscope.files.io import atomic_save, atomic_write_text
from gradscope.files.lock import run_lock
from gradscope.files.rundir import (CONFIG_FILE, EVAL_FILE, METRICS_FILE, RUN_FORMAT, check_resume_state,
                                    is_run_dir, read_evaluation, read_log, read_run_config, relative_command)
from gradscope.train.extend import NewRows, check_extension, extended_model
from gradscope.train.schedule import lr_at
from gradscope.files.validate import check_fits, check_training_memory
from gradscope.version import __version__

__all__ = ["CONFIG_FILE", "EVAL_FILE", "METRICS_FILE", "RUN_FORMAT", "TrainState", "check_fits", "discard_unstarted",
           "is_run_dir", "loss_and_correct", "read_evaluation", "read_run_config", "resumable", "train"]

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
    metrics: dict[str, float]  # loss and accuracy of the last log line ({} before the first)
    rows: NewRows | None = None  # an extension run's trainable rows (the model itself is frozen)

    def trainable(self) -> list[torch.nn.Parameter]:
        """What the optimizer holds: the new rows of an extension run, else every parameter."""
        return list((self.rows if self.rows is not None else self.model).parameters())


class UnstartedRunWarning(UserWarning):
    """A resumed run had no checkpoint yet, so it starts again from iteration 0 (nothing is lost)."""


def resumable(run_dir: Path) -> bool:
    """True when the run directory holds a training checkpoint to resume from."""
    return any(p.name.startswith("step-") for p in list_checkpoints(run_dir))


def discard_unstarted(run_dir: Path) -> None:
    """Make a run killed before its first checkpoint startable again. Such a directory holds only
    its config, a few log lines and perhaps a temporary file of an interrupted write; a fresh start
    redoes all of it, so nothing is lost. Anything else in the directory is refused, not deleted."""
    run_dir = Path(run_dir)
    with run_lock(run_dir):
        remove_stale_temporaries(run_dir)
        others = sorted(p.name for p in run_dir.iterdir() if p.name not in (CONFIG_FILE, METRICS_FILE))
        check(not others, f"run directory: {run_dir} has no checkpoint to resume from but holds {', '.join(others)}; "
                          f"move it away to start the run again")
        for p in run_dir.iterdir():
            p.unlink()


def _fresh_state(cfg: RunConfig, device: torch.device, parent: Path | None = None) -> TrainState:
    heldout = build_heldout(make_task(cfg.task), cfg.train.seed)
    rows = None
    if cfg.extend is not None:
        check(parent is not None, "extend_from: an extension run starts from its parent checkpoint; give its path")
        assert parent is not None
        model = extended_model(cfg, parent).to(device)
        rows = NewRows(model, cfg.task.old_items)
    else:
        torch.manual_seed(cfg.train.seed)  # model initialisation is seeded
        model = SeqModel(cfg.model).to(device)
    optimizer = _optimizer(cfg, list((rows if rows is not None else model).parameters()))
    gen = torch.Generator(device=device).manual_seed(cfg.train.seed + 1)
    return TrainState(model, optimizer, gen, heldout, 0, torch.zeros(3, device=device), 0, {}, rows)


def _optimizer(cfg: RunConfig, params: list[torch.nn.Parameter]) -> torch.optim.Adam:
    t = cfg.train
    return torch.optim.Adam(params, lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=0.0)


def _checkpoint(cfg: RunConfig, state: TrainState) -> dict[str, Any]:
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "gradscope_version": __version__,
        "torch_version": str(torch.__version__), "config": cfg.to_dict(), "iteration": state.iteration,
        "model": state.model.state_dict(), "optimizer": state.optimizer.state_dict(),
        "scheduler": {"name": "warmup-cosine", "iteration": state.iteration},
        "rng": {"data": state.data_gen.get_state(), "data_device": str(state.data_gen.device),
                "torch": torch.get_rng_state()},
        "heldout": heldout_to_dict(state.heldout), "metrics": dict(state.metrics),
        "log_window": {"sums": state.window.detach().cpu(), "steps": state.window_steps},
    }


def _resumed_state(cfg: RunConfig, run_dir: Path, device: torch.device) -> tuple[TrainState, str]:
    """The state at the run's last checkpoint and its log cut back to it, everything validated
    (config.json, the checkpoint, metrics.jsonl, eval.json); nothing is modified here."""
    check(read_run_config(run_dir) == cfg, f"resume: {run_dir / CONFIG_FILE} does not hold this run's configuration")
    found = [p for p in list_checkpoints(run_dir) if p.name.startswith("step-")]
    if not found:
        raise GradscopeError(f"resume: {run_dir} has no checkpoint yet; start it again without --resume "
                             f"after removing the directory")
    loaded = load_checkpoint(found[-1])
    what = f"resume: {found[-1]}"
    check(loaded.config == cfg, f"{what} was written with another configuration than {run_dir / CONFIG_FILE}")
    model = loaded.model.to(device).train()
    rows = None
    if cfg.extend is not None:
        check_extension(cfg, model)
        rows = NewRows(model.requires_grad_(False), cfg.task.old_items)
    params = list((rows if rows is not None else model).parameters())
    optimizer = _optimizer(cfg, params)
    resume = check_resume_state(loaded.raw, cfg, loaded.iteration, optimizer.state_dict(), params, device, what)
    log = read_log(run_dir, cfg, loaded.iteration)
    evaluation = read_evaluation(run_dir)
    check(evaluation is None or evaluation["iteration"] == loaded.iteration == cfg.train.iterations,
          f"resume: {run_dir / EVAL_FILE} evaluates iteration {evaluation and evaluation['iteration']}, but the last "
          f"checkpoint is at {loaded.iteration} of {cfg.train.iterations}; move it away to continue")
    optimizer.load_state_dict(resume.optimizer)
    gen = torch.Generator(device=device)
    gen.set_state(resume.data_rng)
    torch.set_rng_state(resume.torch_rng)
    state = TrainState(model, optimizer, gen, loaded.heldout, loaded.iteration, resume.window.to(device),
                       resume.window_steps, resume.metrics, rows)
    return state, log


def loss_and_correct(model: SeqModel, batch: Batch, decoding: str = DECODING,
                     forward: Callable[[torch.Tensor], torch.Tensor] | None = None, family: type[Task] = Task,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training objective on one batch, as its task ``family`` declares it (:meth:`Task.objective`; the
    default: cross-entropy of token logits): (mean loss over scored positions, # right, # scored).
    ``decoding``: how a feedback model's output phase is fed (:mod:`gradscope.tasks.decoding`); ``forward``:
    the model's map inputs → outputs (default: the model itself; an extension run splices its trainable
    rows in)."""
    forward = model if forward is None else forward
    if decoding == "teacher":
        outputs = forward(teacher_inputs(batch.inputs, batch.targets, model.config.vocab_size))  # (B, T, K)
    elif decoding == "autoregressive":
        outputs = decode_logits(model, batch.inputs, batch.targets, "autoregressive")
    else:
        outputs = forward(batch.inputs)  # (B, T, K) logits, or (B, T, d) points
    return family.objective(outputs, batch.targets)


def train(cfg: RunConfig, run_dir: Path, *, resume: bool = False, stop_after: int | None = None,
          on_step: StepCallback | None = None, command: str = "", extend_from: Path | None = None) -> dict[str, Any]:
    """Train (or resume) the run in ``run_dir``; returns the held-out evaluation when finished
    (an empty dict if ``stop_after`` stopped it early). ``on_step(iteration, log)`` is called after
    every iteration, with the logged metrics on logging iterations and None otherwise.
    ``extend_from``: the parent checkpoint of an extension run (``cfg.extend``; see
    :func:`gradscope.train.extend.extension_config`), needed to start it, not to resume it.

    Everything is checked before the directory is touched: the device, that the model fits the
    task, that model, optimizer, batch and held-out data fit in memory, and on resume every file
    of the run. One process at a time may train a directory; a second gets a :class:`GradscopeError`.
    """
    run_dir = Path(run_dir)
    check(isinstance(cfg, RunConfig), f"cfg: got {type(cfg).__name__}; expected a RunConfig")
    if stop_after is not None:
        as_int(stop_after, "stop_after", 1)
    device = resolve_device(cfg.train.device)
    task = make_task(cfg.task)
    check_fits(cfg, task)
    core_class(cfg.model.core).check_steps(cfg.model.core_config, task.total_len)  # the core's own sizes
    check_training_memory(cfg, task, device)
    if run_dir.exists() and not run_dir.is_dir():
        raise GradscopeError(f"run directory: {run_dir} is a file, not a directory; choose another path")
    if resume and not run_dir.is_dir():
        raise GradscopeError(f"resume: {run_dir} is not a run directory")
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    with run_lock(run_dir):
        if run_dir.is_dir():
            remove_stale_temporaries(run_dir)  # what a killed run of this directory left half-written
        if resume and not resumable(run_dir):  # killed before its first checkpoint: nothing to lose
            check(read_run_config(run_dir) == cfg,
                  f"resume: {run_dir / CONFIG_FILE} does not hold this run's configuration")
            command = str(json.loads((run_dir / CONFIG_FILE).read_text()).get("command", "")) or command
            others = sorted(p.name for p in run_dir.iterdir() if p.name not in (CONFIG_FILE, METRICS_FILE))
            check(not others, f"resume: {run_dir} has no checkpoint to resume from but holds {', '.join(others)}; "
                              f"move it away to start the run again")
            warnings.warn(f"resume: {run_dir} has no checkpoint yet (it stopped before its first); starting it from "
                          f"iteration 0 with its recorded configuration", UnstartedRunWarning, stacklevel=2)
            for name in (CONFIG_FILE, METRICS_FILE):
                (run_dir / name).unlink(missing_ok=True)
            resume = False
        if resume:
            state, log = _resumed_state(cfg, run_dir, device)
            atomic_write_text(run_dir / METRICS_FILE, log, what="resume")  # the redone iterations' lines go
            return _run(cfg, task, run_dir, state, stop_after, on_step, device)
        created = not run_dir.exists()
        state = _started_state(cfg, run_dir, device, command, extend_from)
        try:
            return _run(cfg, task, run_dir, state, stop_after, on_step, device)
        except GradscopeError:
            if state.iteration == 0:  # refused before its first step: leave no half-started run behind
                for name in (CONFIG_FILE, METRICS_FILE):
                    (run_dir / name).unlink(missing_ok=True)
                if created and not any(run_dir.iterdir()):
                    run_dir.rmdir()
            raise


def _started_state(cfg: RunConfig, run_dir: Path, device: torch.device, command: str,
                   parent: Path | None = None) -> TrainState:
    """A fresh run: the state at iteration 0, in a new (or empty) directory holding its config."""
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise GradscopeError(f"run directory: {run_dir} already exists and is not empty; pass --resume "
                             f"to continue it, or choose a new directory")
    state = _fresh_state(cfg, device, parent)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in WRITE_ERRORS:
            raise disk_error(exc, run_dir, "run directory") from None
        raise GradscopeError(f"run directory: cannot create {run_dir} ({exc.strerror})") from None
    atomic_write_text(run_dir / CONFIG_FILE, json.dumps(
        {"format": RUN_FORMAT, "format_version": FORMAT_VERSION, "gradscope_version": __version__,
         "command": relative_command(command, run_dir), "config": cfg.to_dict()}, indent=2) + "\n",
        what="run directory")
    return state


def _append(log: IO[bytes], line: str, path: Path) -> None:
    """Append one log line (the log is unbuffered: a failed write leaves nothing to flush later)."""
    data = memoryview(line.encode())
    try:
        while data:
            written = log.write(data)
            if not written:  # a regular file that takes no byte and reports no error: treat it as full
                raise OSError(errno.ENOSPC, "no byte written")
            data = data[written:]
    except OSError as exc:
        if exc.errno in WRITE_ERRORS:
            raise disk_error(exc, path, "train") from None
        raise


def _open_log(path: Path) -> IO[bytes]:
    try:
        return open(path, "ab", buffering=0)
    except OSError as exc:
        if exc.errno in WRITE_ERRORS or exc.errno == errno.EISDIR:
            raise disk_error(exc, path, "train") from None
        raise


def _run(cfg: RunConfig, task: Task, run_dir: Path, state: TrainState, stop_after: int | None,
         on_step: StepCallback | None, device: torch.device) -> dict[str, Any]:
    excluder = Excluder(state.heldout.exclusion_rows(task)).to(device)
    t = cfg.train
    end = t.iterations if stop_after is None else min(t.iterations, state.iteration + stop_after)
    model, opt = state.model.train(), state.optimizer
    trainable = state.trainable()
    forward = state.rows.forward_fn(model) if state.rows is not None else None
    tic, tic_steps = time.perf_counter(), 0
    log_path = run_dir / METRICS_FILE
    # enable_grad: never inherit a caller's (or an earlier task on this worker thread's) no_grad
    with _open_log(log_path) as log, torch.enable_grad():
        while state.iteration < end:
            lr = lr_at(state.iteration, t.lr, t.warmup, t.iterations)
            for group in opt.param_groups:
                group["lr"] = lr
            batch = sample_excluding(task, t.batch_size, state.data_gen, excluder)
            loss, correct, scored = loss_and_correct(model, batch, t.decoding, forward, type(task))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if t.clip > 0:
                torch.nn.utils.clip_grad_norm_(trainable, t.clip)
            opt.step()
            if state.rows is not None:
                state.rows.write_back(model)
            state.iteration += 1
            state.window += torch.stack([loss.detach(), correct.float(), scored.float()])
            state.window_steps += 1
            tic_steps += 1
            entry = None
            # log on a fixed cadence only, so a stopped-and-resumed run writes the same log
            if state.iteration % t.log_every == 0 or state.iteration == t.iterations:
                loss_sum, n_correct, n_scored = state.window.tolist()
                elapsed = time.perf_counter() - tic
                # positions per second; a corpus task's rows are padded, so there the real (scored)
                # tokens of the steps timed (the window may also hold steps from before a resume)
                timed = n_scored * tic_steps / state.window_steps if task.padded_rows else \
                    tic_steps * t.batch_size * task.total_len
                entry = {"iteration": state.iteration, "loss": loss_sum / state.window_steps,
                         "accuracy": n_correct / max(n_scored, 1), "lr": lr,
                         "tokens_per_s": timed / max(elapsed, 1e-9)}
                _append(log, json.dumps(entry) + "\n", log_path)
                state.metrics = {"loss": entry["loss"], "accuracy": entry["accuracy"]}
                state.window.zero_()
                state.window_steps, tic, tic_steps = 0, time.perf_counter(), 0
            if state.iteration % t.checkpoint_every == 0 or state.iteration == end:
                atomic_save(_checkpoint(cfg, state), run_dir / checkpoint_name(state.iteration), what="checkpoint")
            if on_step is not None:
                on_step(state.iteration, entry)
    if state.iteration < t.iterations:
        return {}
    result = {"iteration": state.iteration, **evaluate_heldout(model, task, state.heldout)}
    atomic_write_text(run_dir / EVAL_FILE, json.dumps(result, indent=2) + "\n", what="train")
    return result
