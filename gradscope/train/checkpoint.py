"""Checkpoint format (version 1) and loading, for gradscope runs and the paper's public code.

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.errors import GradscopeError
from gradscope.models import SeqModel
from gradscope.tasks import Batch, HeldOut, Reverse
from gradscope.train.io import safe_load

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


def _as_int_tensor(value: Any, what: str, path: Path) -> torch.Tensor:
    """An integer tensor widened to int64 (shipped samples store token ids as int16)."""
    if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point or value.dtype.is_complex \
            or value.dtype == torch.bool:
        raise GradscopeError(f"checkpoint: {path}: {what} is not an integer tensor")
    return value.long()


def _load_native(ckpt: dict[str, Any], path: Path) -> Loaded:
    version = ckpt.get("format_version")
    if version not in READABLE_VERSIONS:
        raise GradscopeError(f"checkpoint: {path} has format_version {version!r}; this gradscope reads "
                             f"versions {', '.join(map(str, READABLE_VERSIONS))}")
    try:
        config = RunConfig.from_dict(ckpt["config"])
        h = ckpt["heldout"]
        uniform = Batch(_as_int_tensor(h["uniform_inputs"], "held-out inputs", path),
                        _as_int_tensor(h["uniform_targets"], "held-out targets", path))
        grid = None if h["grid"] is None else _as_int_tensor(h["grid"], "held-out grid", path)
        model = SeqModel(config.model)
        model.load_state_dict(ckpt["model"])
        iteration = int(ckpt["iteration"])
    except (KeyError, TypeError, RuntimeError) as exc:
        raise GradscopeError(f"checkpoint: {path} is malformed ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:160]})") from None
    return Loaded(model.eval(), config, HeldOut(uniform, grid), iteration, path, "gradscope", ckpt)


PAPER_CORES = {"RNN": "elman", "GRU": "gru", "LSTM": "lstm"}
PAPER_PREFIXES = (("rnn.", "core.rnn."), ("in_proj.", "core.in_proj."), ("ssm.", "core.ssm."))


def _paper_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in sd.items():
        for old, new in PAPER_PREFIXES:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        out[key] = value
    return out


def _load_paper(ckpt: dict[str, Any], path: Path) -> Loaded:
    """Import a ``checkpoint_after-N-iters.pt`` written by the paper's public code (SPEC §6).

    Sizes are read from the weights' shapes (init_args only fill in names and PE settings). The
    task is ``reverse`` with L taken from ``held_out_data``: shape (n, L) is a uniform test set,
    (2, 2, N, L, L) the dual-frequency grid. ``iteration`` in the file is 0-based, so the
    number of completed iterations is iteration + 1.
    """
    try:
        (name, module), = ckpt["modules"].items()
        args = dict(module.get("init_args", {}))
        sd = _paper_state_dict(dict(module["state_dict"]))
        vocab_size, hidden = sd["to_logits.weight"].shape
        embed = sd["embedding.weight"].shape[1]
        encoding = args.get("time_encoding")
        pe = "none" if encoding is None else str(args.get("time_encoding_form", "sinusoidal"))
        held = _as_int_tensor(ckpt["held_out_data"], "held_out_data", path)
        length = held.shape[-1]
        if name == "ssm" or module.get("module_name") == "SSM":
            core = "s4d"
            layers = len({k.split(".")[2] for k in sd if k.startswith("core.ssm.")})
            core_config = {"state_size": 2 * sd["core.ssm.0.kernel.C"].shape[1]}
        else:
            core = PAPER_CORES[str(args.get("rnn_name", "GRU")).upper()]
            layers = len([k for k in sd if k.startswith("core.rnn.weight_ih_l")])
            core_config = None
        max_len = sd["time_encoder.embeddings"].shape[0] if "time_encoder.embeddings" in sd else \
            int(args.get("max_length") or 2 * length)
        model_cfg = ModelConfig(core=core, vocab_size=int(vocab_size), embed_size=int(embed), hidden_size=int(hidden),
                                num_layers=layers, pe=pe, pe_combine=encoding or "concat",
                                max_len=max(max_len, 2 * length), core_config=core_config)
        if held.dim() == 5:
            task_cfg = TaskConfig(name="reverse", vocab_size=int(vocab_size), length=length, distribution="dual",
                                  heldout_size=1, grid_per_cell=held.shape[2])
            uniform = Batch(torch.empty(0, 2 * length, dtype=torch.long), torch.empty(0, 2 * length, dtype=torch.long))
            grid = held
        else:
            task_cfg = TaskConfig(name="reverse", vocab_size=int(vocab_size), length=length,
                                  heldout_size=held.shape[0])
            uniform, grid = Reverse(task_cfg).format(held.reshape(-1, length)), None
        config = RunConfig(model=model_cfg, task=task_cfg, train=TrainConfig(seed=int(ckpt.get("random_seed", 0))))
        model = SeqModel(model_cfg)
        if pe == "sinusoidal":
            sd.setdefault("time_encoder.frequencies", model.state_dict()["time_encoder.frequencies"])
        model.load_state_dict(sd)
        iteration = int(ckpt.get("iteration", -1)) + 1
    except GradscopeError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
        raise GradscopeError(f"checkpoint: {path} looks like the paper's format but is malformed "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})") from None
    return Loaded(model.eval(), config, HeldOut(uniform, grid), iteration, path, "paper", ckpt)


def load_checkpoint(path: Path) -> Loaded:
    """Load one checkpoint file (either format) safely."""
    path = Path(path)
    ckpt = safe_load(path)
    if isinstance(ckpt, dict) and ckpt.get("format") == FORMAT:
        return _load_native(ckpt, path)
    if isinstance(ckpt, dict) and "modules" in ckpt and "held_out_data" in ckpt:
        return _load_paper(ckpt, path)
    raise GradscopeError(f"checkpoint: {path} is a torch file but not a gradscope checkpoint or a "
                         f"checkpoint of the paper's code (a model of your own: stability and dynamics take it "
                         f"through `model_factory` or gradscope.wrap; accuracy needs the held-out sets that only "
                         f"gradscope and paper checkpoints carry)")


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
