"""Checkpoint format (version 2) and loading, for gradscope runs and the paper's public code.

A gradscope checkpoint is a ``torch.save`` dict of plain types and tensors only (no numpy), so it
loads with ``weights_only=True``::

    {"format": "gradscope-checkpoint", "format_version": 2, "gradscope_version": str,
     "torch_version": str, "config": {"model": {...}, "task": {...}, "train": {...}},
     "iteration": int (iterations completed), "model": state_dict, "optimizer": state_dict,
     "scheduler": {"name": "warmup-cosine", "iteration": int},
     "rng": {"data": ByteTensor, "data_device": str, "torch": ByteTensor},
     "heldout": {"uniform_inputs": (n, T), "uniform_targets": (n, T), "grid": (2, 2, N, L, L) | None},
     "metrics": {"loss": float, "accuracy": float}}

Format 2 nests a core's own settings in ``config.model.core_config``; format 1 (the shipped samples)
kept S4D's ``state_size``, ``dt_min`` and ``dt_max`` among the shared model fields, and still loads.

Loading validates a checkpoint in full (:func:`validate_checkpoint`, with the checks of
:mod:`gradscope.files.validate`) before any model is built; a malformed file is a one-line
:class:`GradscopeError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.errors import GradscopeError, check
from gradscope.fields import as_int
from gradscope.guard import check_ids, check_tensor, warn_nonfinite
from gradscope.models import SeqModel
from gradscope.models.pe import sinusoidal_frequencies
from gradscope.tasks import HeldOut, Reverse, make_task
from gradscope.files.io import safe_load
from gradscope.files.validate import Checked, check_fits, check_heldout, check_state_dict, model_template

FORMAT = "gradscope-checkpoint"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
CHECKPOINT_RE = re.compile(r"^step-(\d+)\.pt$")
PAPER_RE = re.compile(r"^checkpoint_after-(\d+)-iters\.pt$")


def checkpoint_name(iteration: int) -> str:
    return f"step-{iteration:07d}.pt"


def checkpoint_iteration(path: Path) -> int:
    """The training iteration in a checkpoint's file name (gradscope or paper naming), or -1."""
    m = CHECKPOINT_RE.match(Path(path).name) or PAPER_RE.match(Path(path).name)
    return int(m.group(1)) if m else -1


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints in a run directory (gradscope or paper naming), oldest first."""
    found = [(checkpoint_iteration(p), p) for p in Path(run_dir).iterdir()]
    return [p for i, p in sorted(found) if i >= 0]


@dataclass(frozen=True)
class Loaded:
    """A checkpoint, ready for analysis: the model (eval mode, CPU), its configs and held-out data."""

    model: SeqModel
    config: RunConfig
    heldout: HeldOut
    iteration: int
    path: Path
    source: str  # "gradscope" or "paper"
    raw: dict[str, Any]


def heldout_to_dict(h: HeldOut) -> dict[str, Any]:
    return {"uniform_inputs": h.uniform.inputs.cpu(), "uniform_targets": h.uniform.targets.cpu(),
            "grid": None if h.grid is None else h.grid.cpu()}


def _what(path: Path) -> str:
    return f"checkpoint: {path}"


def _config(data: Any, what: str) -> RunConfig:
    try:
        return RunConfig.from_dict(data)
    except GradscopeError as exc:
        raise GradscopeError(f"{what}: config: {exc}") from None


def _entry(ckpt: dict[str, Any], key: str, what: str) -> Any:
    check(key in ckpt, f"{what}: has no {key!r} entry")
    return ckpt[key]


def _native(ckpt: dict[str, Any], path: Path) -> Checked:
    """Validate a gradscope checkpoint (format 1 or 2)."""
    what = _what(path)
    version = ckpt.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in READABLE_VERSIONS:
        raise GradscopeError(f"{what} has format_version {str(version)[:40]!r}; this gradscope reads "
                             f"versions {', '.join(map(str, READABLE_VERSIONS))}")
    config_data = _entry(ckpt, "config", what)
    check(isinstance(config_data, dict), f"{what}: config is a {type(config_data).__name__}; expected a mapping")
    config = _config(config_data, what)
    task = make_task(config.task)
    try:
        check_fits(config, task)
    except GradscopeError as exc:
        raise GradscopeError(f"{what}: config: {exc}") from None
    iteration = as_int(_entry(ckpt, "iteration", what), f"{what}: iteration", 0, config.train.iterations)
    check(isinstance(ckpt.get("stripped", False), bool), f"{what}: 'stripped' is not True or False")
    h = _entry(ckpt, "heldout", what)
    check(isinstance(h, dict) and {"uniform_inputs", "uniform_targets", "grid"} <= set(h),
          f"{what}: heldout is not a mapping of uniform_inputs, uniform_targets and grid")
    heldout = check_heldout(h["uniform_inputs"], h["uniform_targets"], h["grid"], task, what,
                            rows=config.task.heldout_size, grid_rows=config.task.grid_per_cell)
    state = check_state_dict(_entry(ckpt, "model", what), model_template(config.model, what), what)
    return Checked(config, state, heldout, iteration)


PAPER_CORES = {"RNN": "elman", "GRU": "gru", "LSTM": "lstm"}
PAPER_PREFIXES = (("rnn.", "core.rnn."), ("in_proj.", "core.in_proj."), ("ssm.", "core.ssm."))
_SSM_LAYER = re.compile(r"^core\.ssm\.(\d+)\.")
_RNN_LAYER = re.compile(r"^core\.rnn\.weight_ih_l\d+$")


def _paper_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in sd.items():
        for old, new in PAPER_PREFIXES:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        out[key] = value
    return out


def _weight(sd: dict[str, Any], key: str, ndim: int, what: str) -> torch.Tensor:
    check(key in sd, f"{what}: the state_dict has no {key}")
    return check_tensor(sd[key], f"{what}: weight {key}", kind="float", ndim=ndim)


def _option(args: dict[str, Any], key: str, default: Any, valid: tuple[type, ...], what: str) -> Any:
    value = args.get(key, default)
    check(isinstance(value, valid) and not isinstance(value, bool) or value is default,
          f"{what}: init_args {key} is a {type(value).__name__}")
    return value


def _paper(ckpt: dict[str, Any], path: Path) -> Checked:
    """Validate a ``checkpoint_after-N-iters.pt`` written by the paper's public code (docs/definitions.md §6).

    Sizes are read from the weights' shapes (init_args only fill in names and PE settings). The
    task is ``reverse`` with L taken from ``held_out_data``: shape (n, L) is a uniform test set,
    (2, 2, N, L, L) the dual-frequency grid. ``iteration`` in the file is 0-based, so the
    number of completed iterations is iteration + 1.
    """
    what = f"{_what(path)} (the paper's format)"
    modules = ckpt["modules"]
    check(isinstance(modules, dict) and len(modules) == 1,
          f"{what}: 'modules' must map one module name to its module; got {type(modules).__name__}")
    (name, module), = modules.items()
    check(isinstance(module, dict), f"{what}: module {str(name)[:40]!r} is a {type(module).__name__}; expected a mapping")
    args = module.get("init_args")
    args = {} if args is None else args
    check(isinstance(args, dict), f"{what}: init_args is a {type(args).__name__}; expected a mapping")
    sd = _entry(module, "state_dict", what)
    check(isinstance(sd, dict) and all(isinstance(k, str) for k in sd), f"{what}: the state_dict is not a mapping of names")
    sd = _paper_state_dict(dict(sd))
    vocab_size, hidden = _weight(sd, "to_logits.weight", 2, what).shape
    embed = _weight(sd, "embedding.weight", 2, what).shape[1]
    encoding = _option(args, "time_encoding", None, (str,), what)
    pe = "none" if encoding is None else _option(args, "time_encoding_form", "sinusoidal", (str,), what)
    held = check_tensor(ckpt["held_out_data"], f"{what}: held_out_data", kind="int", ndim=(2, 5))
    length = held.shape[-1]
    if name == "ssm" or module.get("module_name") == "SSM":
        core = "s4d"
        layers = len({m.group(1) for m in map(_SSM_LAYER.match, sd) if m})
        core_config = {"state_size": 2 * _weight(sd, "core.ssm.0.kernel.C", 3, what).shape[1]}
    else:
        rnn = _option(args, "rnn_name", "GRU", (str,), what)
        check(rnn.upper() in PAPER_CORES, f"{what}: rnn_name {rnn[:40]!r} is none of {', '.join(PAPER_CORES)}")
        core, layers, core_config = PAPER_CORES[rnn.upper()], sum(1 for k in sd if _RNN_LAYER.match(k)), None
    if "time_encoder.embeddings" in sd:
        max_len = _weight(sd, "time_encoder.embeddings", 2, what).shape[0]
    else:
        max_len = as_int(_option(args, "max_length", None, (int, float), what) or 2 * length,
                         f"{what}: init_args max_length", 1, 2**31 - 1)
    try:
        model_cfg = ModelConfig(core=core, vocab_size=int(vocab_size), embed_size=int(embed), hidden_size=int(hidden),
                                num_layers=layers, pe=pe, pe_combine=encoding or "concat",
                                max_len=max(max_len, 2 * length), core_config=core_config)
        if held.dim() == 5:
            task_cfg = TaskConfig(name="reverse", vocab_size=int(vocab_size), length=length, distribution="dual",
                                  heldout_size=1, grid_per_cell=max(held.shape[2], 1))
        else:
            task_cfg = TaskConfig(name="reverse", vocab_size=int(vocab_size), length=length,
                                  heldout_size=max(held.shape[0], 1))
        seed = as_int(ckpt.get("random_seed", 0), "random_seed", 0, 2**63 - 1)
        config = RunConfig(model=model_cfg, task=task_cfg, train=TrainConfig(seed=seed))
    except GradscopeError as exc:
        raise GradscopeError(f"{what}: {exc}") from None
    iteration = as_int(ckpt.get("iteration", -1), f"{what}: iteration", -1, 2**62) + 1
    task = make_task(task_cfg)
    if held.dim() == 5:
        empty = torch.empty(0, task.total_len, dtype=torch.long)
        heldout = check_heldout(empty, empty, held, task, what, grid_rows=task_cfg.grid_per_cell)
    else:
        check_ids(held, f"{what}: held_out_data", int(vocab_size))
        uniform = Reverse(task_cfg).format(held.long())
        heldout = check_heldout(uniform.inputs, uniform.targets, None, task, what, rows=task_cfg.heldout_size)
    if pe == "sinusoidal" and "time_encoder.frequencies" not in sd:  # the paper's code kept it out of its files
        sd["time_encoder.frequencies"] = sinusoidal_frequencies(int(embed)).float()
    state = check_state_dict(sd, model_template(model_cfg, what), what)
    return Checked(config, state, heldout, iteration)


def validate_checkpoint(ckpt: Any, path: Path) -> tuple[Checked, str]:
    """Check a loaded checkpoint object (either format): returns it validated, and its source
    ("gradscope" or "paper"). Raises :class:`GradscopeError` naming the first problem."""
    if isinstance(ckpt, dict) and isinstance(ckpt.get("format"), str) and ckpt["format"] == FORMAT:
        return _native(ckpt, path), "gradscope"
    if isinstance(ckpt, dict) and "modules" in ckpt and "held_out_data" in ckpt:
        return _paper(ckpt, path), "paper"
    raise GradscopeError(f"checkpoint: {path} is a torch file but not a gradscope checkpoint or a "
                         f"checkpoint of the paper's code (a model of your own: stability and dynamics take it "
                         f"through model_factory (--model-factory) or gradscope.wrap; accuracy needs the held-out sets that only "
                         f"gradscope and paper checkpoints carry)")


def load_checkpoint(path: Path) -> Loaded:
    """Load one checkpoint file (either format) safely: validated in full before its model is built."""
    path = Path(path)
    ckpt = safe_load(path)
    checked, source = validate_checkpoint(ckpt, path)
    model = SeqModel(checked.config.model)
    model.load_state_dict(checked.state)  # names and shapes were checked against this config
    warn_nonfinite(model, f"checkpoint: {path}")
    return Loaded(model.eval(), checked.config, checked.heldout, checked.iteration, path, source, ckpt)


def resolve_checkpoints(path: Path) -> list[Path]:
    """A checkpoint file → [it]; a run directory → all its checkpoints, oldest first."""
    path = Path(path)
    if path.is_dir():
        found = list_checkpoints(path)
        if not found:
            raise GradscopeError(f"checkpoint: {path} is a directory with no checkpoints "
                                 f"(step-*.pt or checkpoint_after-*-iters.pt)")
        return found
    if not path.exists():
        raise GradscopeError(f"checkpoint: {path} does not exist")
    return [path]


def load(path: str | Path) -> Loaded:
    """Load a checkpoint file, or the latest checkpoint of a run directory.

    Returns a :class:`Loaded` with the model (eval mode, CPU), configs and held-out data.
    """
    return load_checkpoint(resolve_checkpoints(Path(path))[-1])
