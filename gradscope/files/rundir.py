"""A run directory's files, read and validated: ``config.json``, ``metrics.jsonl``,
``eval.json``, and the resume state of its last checkpoint (optimizer, random generators, log
window, last logged metrics). The one reader of run directories: training reads them here to
resume, reports and sweeps to show them.

Resuming reads everything through here before it modifies anything, so a malformed file is a
one-line :class:`GradscopeError` and leaves the directory as it was. Reports read the same files
more leniently (:func:`read_config_parts`, :func:`read_metrics`): a run still writing its log, or
a config of another gradscope version, is still shown.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gradscope.config import RunConfig
from gradscope.errors import GradscopeError, check
from gradscope.fields import as_int
from gradscope.guard import check_tensor

CONFIG_FILE, METRICS_FILE, EVAL_FILE = "config.json", "metrics.jsonl", "eval.json"
RUN_FORMAT = "gradscope-run"
METRIC_KEYS = ("loss", "accuracy")  # what a checkpoint keeps of the last log line
REQUIRED_SETTINGS = ("params", "lr", "betas", "eps", "weight_decay")  # Adam reads these without a default


def relative_command(command: str, run_dir: Path, cwd: Path | None = None) -> str:
    """``command`` as recorded in a run: every argument that names a path (absolute, or relative to
    ``cwd``, the working directory) inside ``run_dir`` is written relative to it ('.' for the run
    directory itself), and any other absolute path by its name alone, so a run never records the
    home or work directory of the machine that trained it."""
    if not command:
        return command
    cwd = Path(cwd or Path.cwd()).absolute()
    root = Path(os.path.abspath(cwd / run_dir))
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: not a command line we made; keep it word by word
        words = command.split()
    out: list[str] = []
    for word in words:
        named = out[-1:] in (["-o"], ["--out"], ["--resume"])  # options whose value is the run directory
        if word.startswith("-") or not word or "/" not in word and not named and not (cwd / word).exists():
            out.append(word)
            continue
        path = Path(os.path.abspath(cwd / os.path.expanduser(word)))
        if path == root or root in path.parents:
            out.append(os.path.relpath(path, root))
        elif os.path.isabs(os.path.expanduser(word)):
            out.append(path.name)
        else:
            out.append(word)
    return shlex.join(out)


MAX_RUN_FILE = 256 << 20  # bytes of config.json, eval.json or metrics.jsonl read into memory


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a run directory (it holds a ``config.json``)."""
    return (Path(path) / CONFIG_FILE).is_file()


def read_text(path: Path, what: str) -> str:
    """A run file's text: a plain file of at most :data:`MAX_RUN_FILE` bytes, UTF-8. A missing,
    unreadable, oversized or undecodable file is a user error."""
    path = Path(path)
    try:
        if not path.is_file():
            raise GradscopeError(f"{what}: {path} is not a plain file")
        size = path.stat().st_size
        if size > MAX_RUN_FILE:
            raise GradscopeError(f"{what}: {path} is {size / 1e6:.0f} MB; a run file is at most "
                                 f"{MAX_RUN_FILE >> 20} MB")
        return path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise GradscopeError(f"{what}: cannot read {path} ({exc.strerror or type(exc).__name__})") from None
    except UnicodeDecodeError as exc:
        raise GradscopeError(f"{what}: {path} is not UTF-8 text (byte {exc.start})") from None


def parse_json(text: str) -> Any:
    """JSON, or a ValueError (a document nested too deeply for the parser is one too)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def read_json(path: Path, what: str) -> Any:
    try:
        return parse_json(read_text(path, what))
    except GradscopeError:
        raise
    except ValueError as exc:
        msg = f"{exc.msg}, line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else str(exc)[:100]
        raise GradscopeError(f"{what}: {path} is not valid JSON ({msg})") from None


def read_config_parts(run_dir: Path, what: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any],
                                                          dict[str, Any]]:
    """(config.json, model, task, train) of a run, each part a plain dict as written (for reports:
    a config of another gradscope version is shown as it is; :func:`read_run_config` builds one)."""
    path = Path(run_dir) / CONFIG_FILE
    data = read_json(path, what)
    check(isinstance(data, dict) and data.get("format") == RUN_FORMAT,
          f"{what}: {run_dir} has a config.json that is not a gradscope run config")
    cfg = data.get("config", {})
    parts = [cfg.get(k, {}) for k in ("model", "task", "train")] if isinstance(cfg, dict) else [None]
    check(all(isinstance(p, dict) for p in parts),
          f"{what}: {path}: its 'config' is not an object of model, task and train objects")
    model, task, train = parts
    if "seed" in train:
        as_int(train["seed"], f"{what}: {path}: train seed")
    return data, model, task, train


def read_run_config(run_dir: Path) -> RunConfig:
    """The configuration in a run directory's ``config.json``."""
    path = Path(run_dir) / CONFIG_FILE
    data = read_json(path, "resume")
    if not isinstance(data, dict) or data.get("format") != RUN_FORMAT or "config" not in data:
        raise GradscopeError(f"resume: {path} is not a gradscope run config (expected an object with "
                             f"\"format\": \"{RUN_FORMAT}\" and \"config\")")
    try:
        return RunConfig.from_dict(data["config"])
    except GradscopeError as exc:
        raise GradscopeError(f"resume: {path}: {exc}") from None


def read_evaluation(run_dir: Path, what: str = "evaluation") -> dict[str, Any] | None:
    """The held-out evaluation in ``eval.json`` (None when the run has not finished): an object with
    an integer ``iteration`` and, when present, ``uniform``: an integer ``n`` and the scores, each a number
    ({n, token_accuracy, sequence_accuracy} for a token task; a family of vector positions records the
    scores it declares, :meth:`gradscope.tasks.base.Task.heldout_scores`)."""
    path = Path(run_dir) / EVAL_FILE
    if not path.exists():
        return None
    doc = read_json(path, what)
    bad = not isinstance(doc, dict) or not _integer(doc.get("iteration"))
    uniform = doc.get("uniform") if isinstance(doc, dict) else None
    if not bad and uniform is not None:
        scores = [v for k, v in uniform.items() if k != "n"] if isinstance(uniform, dict) else []
        bad = not isinstance(uniform, dict) or not _integer(uniform.get("n")) \
            or not scores or not all(_number(v) for v in scores)
    if bad:
        raise GradscopeError(f"{what}: {path} is not a gradscope evaluation (expected an object with an integer "
                             f"\"iteration\" and \"uniform\": {{n, token_accuracy, …}}, every score a number)")
    return doc


def read_metrics(run_dir: Path, what: str) -> list[dict[str, float]]:
    """``metrics.jsonl`` as shown (not resumed): one object per logged iteration, with an integer
    ``iteration`` and numbers. A line cut short (a run still writing, or killed mid-line) is
    skipped; any other line that is not such an object is a user error. Fields that are not
    numbers are dropped. A run without a log has none ([])."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    for n, line in enumerate(read_text(path, what).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = parse_json(line)
        except ValueError:
            continue  # cut short
        if not isinstance(row, dict) or not _integer(row.get("iteration")):
            raise GradscopeError(f"{what}: {path} line {n}: {line[:60]!r}; expected an object with an integer "
                                 f"'iteration' and numbers")
        rows.append({k: v for k, v in row.items() if _number(v)})
    return rows


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def log_iterations(cfg: RunConfig, iteration: int) -> int:
    """How many log lines a run writes up to ``iteration``: one every ``log_every``, and at the end."""
    t = cfg.train
    return iteration // t.log_every + (1 if iteration == t.iterations and iteration % t.log_every else 0)


def read_log(run_dir: Path, cfg: RunConfig, iteration: int) -> str:
    """The log ``metrics.jsonl`` cut back to ``iteration`` (work after the last checkpoint is
    redone). Only its last line may be incomplete (a kill while writing it); every other line must
    be a log entry, and the entries kept must be exactly those the run logs up to ``iteration``."""
    path = Path(run_dir) / METRICS_FILE
    what = f"resume: {path}"
    if not path.is_file():
        raise GradscopeError(f"{what} is missing; the run's log cannot be continued")
    lines = read_text(path, "resume").split("\n")
    lines.pop()  # "" after the last newline, or a line cut short by a kill
    kept, last = [], 0
    for n, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise GradscopeError(f"{what}: line {n} is not JSON") from None
        if not isinstance(entry, dict) or isinstance(entry.get("iteration"), bool) \
                or not isinstance(entry.get("iteration"), int) or not all(_number(v) for v in entry.values()):
            raise GradscopeError(f"{what}: line {n} is not a log entry (an object of numbers with an integer "
                                 f"\"iteration\")")
        check(entry["iteration"] > last, f"{what}: line {n} (iteration {entry['iteration']}) does not follow "
                                         f"iteration {last}")
        last = entry["iteration"]
        if last <= iteration:
            kept.append((last, line))
    t = cfg.train
    expected = [k * t.log_every for k in range(1, iteration // t.log_every + 1)]
    if log_iterations(cfg, iteration) > len(expected):
        expected.append(iteration)
    found = [i for i, _ in kept]
    if found != expected:
        raise GradscopeError(f"{what} logs iterations {_span(found)} up to the checkpoint at {iteration}, but the "
                             f"run logs {_span(expected)}; the log does not belong to this checkpoint")
    return "".join(f"{line}\n" for _, line in kept)


def _span(its: list[int]) -> str:
    if not its:
        return "none"
    return ", ".join(map(str, its)) if len(its) <= 3 else f"{its[0]}, {its[1]} … {its[-1]} ({len(its)} lines)"


@dataclass(frozen=True)
class ResumeState:
    """What a training checkpoint holds beyond the model, validated against the run."""

    optimizer: dict[str, Any]
    data_rng: torch.Tensor
    torch_rng: torch.Tensor
    window: torch.Tensor  # (3,) loss sum, correct, scored since the last log line
    window_steps: int
    metrics: dict[str, float]  # the last log line's loss and accuracy ({} before the first)


def _plain_equal(a: Any, b: Any) -> bool:
    """Equality of plain config values (tuples and lists alike); a tensor or other object is unequal."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_plain_equal(x, y) for x, y in zip(a, b))
    plain = (type(None), bool, int, float, str)
    return isinstance(a, plain) and isinstance(b, plain) and type(a) is type(b) and a == b


def check_optimizer(saved: Any, fresh: dict[str, Any], params: list[torch.Tensor], iteration: int,
                    what: str) -> dict[str, Any]:
    """An Adam state_dict that fits the model: the fresh optimizer's groups and settings (the
    learning rate aside, which the schedule sets every step), and for each parameter a step count
    in [0, iteration] and moments of the parameter's shape (the second one never negative)."""
    check(isinstance(saved, dict) and set(saved) == {"state", "param_groups"},
          f"{what}: optimizer is not an optimizer state_dict (state and param_groups)")
    groups = saved["param_groups"]
    check(isinstance(groups, list) and len(groups) == len(fresh["param_groups"]),
          f"{what}: optimizer has {len(groups) if isinstance(groups, list) else 'no'} parameter group(s); "
          f"expected {len(fresh['param_groups'])}")
    moments = {"step", "exp_avg", "exp_avg_sq"}
    for group, want in zip(groups, fresh["param_groups"]):
        check(isinstance(group, dict), f"{what}: optimizer parameter group is a {type(group).__name__}")
        ids = group.get("params")
        check(isinstance(ids, list) and all(type(i) is int for i in ids) and ids == want["params"],
              f"{what}: optimizer parameters do not match the model's {len(want['params'])} parameters")
        missing = [k for k in REQUIRED_SETTINGS if k not in group]
        check(not missing, f"{what}: optimizer parameter group lacks {', '.join(missing)}")
        for key, value in want.items():
            if key in ("params", "lr", "initial_lr") or key not in group:
                continue  # other settings torch fills in with their defaults
            check(_plain_equal(group[key], value), f"{what}: optimizer setting {key} is {str(group[key])[:40]!r}; "
                                                   f"the run's config gives {value!r}")
        check(_number(group.get("lr")) and math.isfinite(group["lr"]) and group["lr"] >= 0,
              f"{what}: optimizer learning rate is not a finite number >= 0")
        if want.get("amsgrad"):
            moments.add("max_exp_avg_sq")
    state = saved["state"]
    check(isinstance(state, dict), f"{what}: optimizer state is a {type(state).__name__}; expected a mapping")
    for pid in state:
        check(type(pid) is int and 0 <= pid < len(params), f"{what}: optimizer state for parameter {str(pid)[:20]!r}, "
                                                           f"which the model does not have")
    # every parameter of a gradscope model gets a gradient at every step: after the first, each has state
    lacking = sorted(set(range(len(params))) - set(state)) if iteration > 0 else []
    check(not lacking, f"{what}: optimizer state lacks parameter(s) {', '.join(map(str, lacking[:5]))} "
                       f"of {len(params)}")
    for pid, entry in state.items():
        check(isinstance(entry, dict) and set(entry) == moments,
              f"{what}: optimizer state of parameter {pid} is not {', '.join(sorted(moments))}")
        step = check_tensor(entry["step"], f"{what}: optimizer step of parameter {pid}", kind="float", shape=())
        value = float(step)
        check(math.isfinite(value) and value == int(value) and 1 <= value <= iteration,
              f"{what}: optimizer step of parameter {pid} is {value}; expected a count in 1..{iteration}")
        shape = tuple(params[pid].shape)
        for key in sorted(moments - {"step"}):
            moment = check_tensor(entry[key], f"{what}: optimizer {key} of parameter {pid}", kind="float", shape=shape)
            check(key == "exp_avg" or not bool((moment < 0).any()),
                  f"{what}: optimizer {key} of parameter {pid} has negative entries")
    return saved


def check_generator_state(state: Any, device: torch.device, what: str) -> torch.Tensor:
    """A random generator's state for ``device``, as torch accepts it (tried on a scratch generator)."""
    t = check_tensor(state, what, kind="int", ndim=1)
    check(t.dtype == torch.uint8, f"{what}: dtype {str(t.dtype).replace('torch.', '')}; expected uint8")
    try:
        torch.Generator(device=device).set_state(t)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise GradscopeError(f"{what}: not a valid generator state ({str(exc).splitlines()[0][:80]})") from None
    return t


def check_resume_state(raw: dict[str, Any], cfg: RunConfig, iteration: int, fresh_optimizer: dict[str, Any],
                       params: list[torch.Tensor], device: torch.device, what: str) -> ResumeState:
    """Everything a checkpoint must hold beyond the model to continue training exactly."""
    check(raw.get("stripped", False) is False, f"{what} is a stripped sample checkpoint (no optimizer state); "
                                               f"it can be analysed but not resumed")
    for key in ("optimizer", "rng", "log_window"):
        check(key in raw, f"{what} has no {key!r} entry; it cannot be resumed")
    optimizer = check_optimizer(raw["optimizer"], fresh_optimizer, params, iteration, what)
    rng = raw["rng"]
    check(isinstance(rng, dict) and {"data", "data_device", "torch"} <= set(rng),
          f"{what}: rng is not a mapping of data, data_device and torch")
    check(isinstance(rng["data_device"], str) and rng["data_device"] == str(torch.Generator(device=device).device),
          f"{what}: the run's data generator lives on {str(rng['data_device'])[:40]!r}, but this run would use "
          f"{device}; resume on the same device")
    data_rng = check_generator_state(rng["data"], device, f"{what}: data generator state")
    torch_rng = check_generator_state(rng["torch"], torch.device("cpu"), f"{what}: torch generator state")
    window = raw["log_window"]
    check(isinstance(window, dict) and {"sums", "steps"} <= set(window), f"{what}: log_window is not sums and steps")
    sums = check_tensor(window["sums"], f"{what}: log_window sums", kind="float", shape=(3,))
    t = cfg.train
    expected = 0 if iteration % t.log_every == 0 or iteration == t.iterations else iteration % t.log_every
    steps = as_int(window["steps"], f"{what}: log_window steps", expected, expected)
    metrics = raw.get("metrics", {})
    check(isinstance(metrics, dict) and set(metrics) in (set(), set(METRIC_KEYS))
          and all(_number(v) for v in metrics.values()),
          f"{what}: metrics is not {{}} or the numbers {' and '.join(METRIC_KEYS)}")
    return ResumeState(optimizer, data_rng, torch_rng, sums, steps, dict(metrics))
