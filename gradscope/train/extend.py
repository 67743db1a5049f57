"""Vocabulary extension (paper §4.2): append rows for new items to a pretrained model's input
embedding and output projection, and train those rows only.

The extended model of vocabulary K' has the parent's weights everywhere; its new embedding rows
K … K'−1 and new output rows K … K'−1 are initialised as a fresh model's rows are (seeded by the
run's seed: ``nn.Embedding``'s N(0, 1), ``nn.Linear``'s uniform), and the parent's query-token row
moves from row K to row K'. Everything pretrained is frozen: the core, the PE, the phase vectors of
a feedback model, the original items' embedding and output rows and the query row.

The trainable rows are separate parameters (:class:`NewRows`): the optimizer holds them and nothing
else, so it has no state for any frozen value, and the frozen values are never written (training
reads the model through ``torch.func.functional_call`` with the rows spliced in, and the rows are
copied back into the model after each step, so checkpoints hold the whole model as usual).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradscope.config import ExtendConfig, RunConfig
from gradscope.errors import GradscopeError, check
from gradscope.models import SeqModel
from gradscope.tasks import make_task
from gradscope.tasks.registry import check_settings
from gradscope.files.checkpoint import load_checkpoint, resolve_checkpoints
from gradscope.files.io import sha256_file

ROW_PARAMETERS = ("embedding.weight", "to_logits.weight", "to_logits.bias")  # where the new rows are


def frozen_parameters(model: SeqModel, old: int) -> tuple[str, ...]:
    """The frozen parameters of an extended model whose first ``old`` items are pretrained: every
    parameter not in :data:`ROW_PARAMETERS` by name, and the pretrained rows of those, as
    ``name[a:b]`` (rows a … b−1)."""
    K = model.config.vocab_size
    names = [n for n, _ in model.named_parameters() if n not in ROW_PARAMETERS]
    return (*names, f"embedding.weight[0:{old}]", f"embedding.weight[{K}:{K + 1}]",
            f"to_logits.weight[0:{old}]", f"to_logits.bias[0:{old}]")


class NewRows(nn.Module):
    """The trainable rows old … K−1 of an extended model's embedding and output projection, as
    separate parameters: ``embedding`` (K−old, E), ``weight`` (K−old, H), ``bias`` (K−old,)."""

    def __init__(self, model: SeqModel, old: int) -> None:
        super().__init__()
        K = model.config.vocab_size
        self.old, self.vocab_size = old, K
        self.embedding = nn.Parameter(model.embedding.weight.detach()[old:K].clone())
        self.weight = nn.Parameter(model.to_logits.weight.detach()[old:K].clone())
        self.bias = nn.Parameter(model.to_logits.bias.detach()[old:K].clone())

    def merged(self, model: SeqModel) -> dict[str, torch.Tensor]:
        """The model's row parameters with these rows spliced in (differentiable in the rows only)."""
        o, K = self.old, self.vocab_size
        e, w, b = model.embedding.weight.detach(), model.to_logits.weight.detach(), model.to_logits.bias.detach()
        return {"embedding.weight": torch.cat([e[:o], self.embedding, e[K:]]),  # (K+1, E)
                "to_logits.weight": torch.cat([w[:o], self.weight]),  # (K, H)
                "to_logits.bias": torch.cat([b[:o], self.bias])}  # (K,)

    def forward_fn(self, model: SeqModel) -> Any:
        """A function inputs → logits of the model with these rows (what training differentiates)."""
        return lambda inputs: torch.func.functional_call(model, self.merged(model), (inputs,))

    @torch.no_grad()
    def write_back(self, model: SeqModel) -> None:
        """Copy the rows into the model (its frozen rows untouched)."""
        o, K = self.old, self.vocab_size
        model.embedding.weight[o:K].copy_(self.embedding)
        model.to_logits.weight[o:K].copy_(self.weight)
        model.to_logits.bias[o:K].copy_(self.bias)


def parent_checkpoint(path: Path) -> Path:
    """A checkpoint file, or the last checkpoint of a run directory."""
    return resolve_checkpoints(Path(path))[-1]


def extension_config(parent: Path, vocab_size: int, *, new_item_share: float | None = None,
                     train: dict[str, Any] | None = None, task: dict[str, Any] | None = None) -> RunConfig:
    """The run config that extends the checkpoint ``parent`` (a file or run directory) to
    ``vocab_size`` items: the parent's model and task with the larger vocabulary, its training
    settings overridden by ``train`` (TrainConfig fields), its task settings by ``task`` (TaskConfig
    fields; ``name`` and ``dim`` must agree with the parent), and the data's share of new items
    (None: uniform over all items, as the paper did)."""
    path = parent_checkpoint(parent)
    loaded = load_checkpoint(path)
    cfg, what = loaded.config, f"extend_from: {path}"
    task_opts, train_opts = dict(task or {}), dict(train or {})
    for key in ("name", "dim"):
        if key in task_opts and task_opts[key] != getattr(cfg.task, key):
            flag = "--task" if key == "name" else "--dim"
            raise GradscopeError(f"{flag}: got {task_opts[key]!r}; the checkpoint {path} was trained with "
                                 f"{key} {getattr(cfg.task, key)!r}, and an extended model keeps its task")
    check_settings(cfg.task.name, task_opts, task_opts.get("distribution", cfg.task.distribution))
    check(cfg.model.inputs == "tokens" and make_task(cfg.task).inputs == "tokens",
          f"{what} is a checkpoint of the {cfg.task.name} task, whose tokens are vectors: it has no vocabulary "
          f"to extend")
    check(make_task(cfg.task).num_classes == cfg.task.vocab_size,
          f"{what} is a checkpoint of the {cfg.task.name} task, whose classes are not its vocabulary items; "
          f"extension needs a task whose K classes are the K items")
    K = cfg.model.vocab_size
    check(isinstance(vocab_size, int) and not isinstance(vocab_size, bool) and vocab_size > K,
          f"vocab_size: got {vocab_size}; extending the checkpoint {path} (vocabulary {K}) needs more than {K} items")
    check(cfg.train.decoding != "autoregressive",
          f"{what} was trained free-running (decoding autoregressive); extension trains teacher-forced or "
          f"standard models")
    check(not train_opts.get("decoding") or train_opts["decoding"] == cfg.train.decoding,
          f"decoding: got {train_opts.get('decoding')!r}; the extended model keeps its parent's decoding "
          f"({cfg.train.decoding})")
    try:
        task_cfg = dataclasses.replace(cfg.task, **{**task_opts, "vocab_size": vocab_size, "old_items": K,
                                                    "new_item_share": new_item_share})
        train_cfg = dataclasses.replace(cfg.train, **train_opts)
    except TypeError as exc:  # an unknown field name: a caller's bug, said in one line
        raise GradscopeError(f"extend: {exc}") from None
    model_cfg = dataclasses.replace(cfg.model, vocab_size=vocab_size)  # the PE keeps its table (max_len)
    with torch.device("meta"):
        frozen = frozen_parameters(SeqModel(model_cfg), K)
    extend = ExtendConfig(parent=path.name, parent_sha256=sha256_file(path), parent_iteration=loaded.iteration,
                          frozen=frozen)
    return RunConfig(model=model_cfg, task=task_cfg, train=train_cfg, extend=extend)


def extended_model(cfg: RunConfig, parent: Path) -> SeqModel:
    """The model of the extension run ``cfg`` at iteration 0: the checkpoint ``parent`` (whose bytes
    must have the sha256 ``cfg`` records) with new rows initialised as a fresh model's, seeded by
    ``cfg.train.seed``. Every parameter has ``requires_grad`` False (train :class:`NewRows`)."""
    assert cfg.extend is not None
    path = parent_checkpoint(parent)
    digest = sha256_file(path)
    check(digest == cfg.extend.parent_sha256,
          f"extend_from: {path} has sha256 {digest[:12]}…; the run was configured from a checkpoint with "
          f"{cfg.extend.parent_sha256[:12]}…")
    loaded = load_checkpoint(path)
    old = cfg.task.old_items
    check(loaded.config.model == dataclasses.replace(cfg.model, vocab_size=old), f"extend_from: {path} holds another model than the run extends")
    torch.manual_seed(cfg.train.seed)  # the new rows' initialisation is seeded
    model = SeqModel(cfg.model)
    K = cfg.model.vocab_size
    with torch.no_grad():
        state = loaded.model.state_dict()
        for name, value in model.state_dict().items():
            if name == "embedding.weight":
                value[:old].copy_(state[name][:old])
                value[K].copy_(state[name][old])  # the query token's row
            elif name in ROW_PARAMETERS:
                value[:old].copy_(state[name])
            else:
                value.copy_(state[name])
    return model.requires_grad_(False)


def check_extension(cfg: RunConfig, model: SeqModel) -> None:
    """The frozen parameters ``cfg`` lists are those of ``model`` (a checkpoint's config and weights
    agree on what was frozen)."""
    assert cfg.extend is not None
    found = frozen_parameters(model, cfg.task.old_items)
    check(tuple(cfg.extend.frozen) == found,
          f"extend: the config lists frozen parameters {', '.join(cfg.extend.frozen[:3])}…; this model's are "
          f"{', '.join(found[:3])}…")


__all__ = ["NewRows", "check_extension", "extended_model", "extension_config", "frozen_parameters",
           "parent_checkpoint"]
