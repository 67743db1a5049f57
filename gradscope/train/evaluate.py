"""Held-out evaluation of a model (predictions in bounded chunks, no gradients)."""

from __future__ import annotations

from typing import Any

import torch

from gradscope.analysis.accuracy import grid_target_accuracy, sequence_accuracy, token_accuracy, token_correct
from gradscope.fields import PREDICT_CHUNK
from gradscope.models import SeqModel
from gradscope.tasks.decoding import decode
from gradscope.tasks import GROUP_NAMES, Batch, HeldOut, Task, grid_batch


@torch.no_grad()
def predict(model: SeqModel, inputs: torch.Tensor, chunk: int = PREDICT_CHUNK) -> torch.Tensor:
    """Argmax predictions (n, T) for inputs (n, T), computed ``chunk`` rows at a time."""
    device = next(model.parameters()).device
    out = [model(inputs[i:i + chunk].to(device)).argmax(-1).cpu() for i in range(0, inputs.shape[0], chunk)]
    return torch.cat(out) if out else inputs.new_empty(inputs.shape)


@torch.no_grad()
def predict_vectors(model: SeqModel, inputs: torch.Tensor, chunk: int = PREDICT_CHUNK) -> torch.Tensor:
    """Point predictions (n, T, d) for vector inputs (n, T, d + 1), ``chunk`` rows at a time."""
    device = next(model.parameters()).device
    out = [model(inputs[i:i + chunk].to(device)).cpu() for i in range(0, inputs.shape[0], chunk)]
    return torch.cat(out) if out else inputs.new_empty(*inputs.shape[:2], model.config.vocab_size)


def predict_decoded(model: SeqModel, batch: Batch, decoding: str, chunk: int = PREDICT_CHUNK) -> torch.Tensor:
    """Argmax predictions (n, T): a feedback model's output phase fed by ``decoding`` (teacher or
    autoregressive, :mod:`gradscope.tasks.decoding`); a standard model ignores ``decoding``."""
    if not model.config.feedback:
        return predict(model, batch.inputs, chunk)
    return decode(model, batch.inputs, batch.targets, decoding, chunk)


def item_accuracy(preds: torch.Tensor, targets: torch.Tensor, old_items: int) -> dict[str, float]:
    """Token accuracy over scored positions whose target is an old item (< old_items) or a new one."""
    correct, scored = token_correct(preds, targets)
    new = targets >= old_items
    return {name: float(correct[scored & m].float().mean()) for name, m in (("old", ~new), ("new", new))}


def evaluate_heldout(model: SeqModel, task: Task, heldout: HeldOut) -> dict[str, Any]:
    """Token and sequence accuracy on the uniform held-out set; target accuracy per grid cell. A
    feedback model: ``uniform`` self-fed (autoregressive), ``uniform_teacher`` ground-truth fed, the
    grid self-fed. An extended vocabulary: ``items``, the accuracy on old and new items. A family whose
    positions hold vectors (point predictions): ``uniform`` holds the scores it declares (:meth:`Task.heldout_scores`)."""
    was_training = model.training
    model.eval()
    result: dict[str, Any] = {}
    held = heldout.uniform
    if task.inputs == "vectors":
        result["uniform"] = {"n": int(held.inputs.shape[0]),
                             **task.heldout_scores(predict_vectors(model, held.inputs), held.targets)}
        model.train(was_training)
        return result
    if held.inputs.shape[0]:
        for key, decoding in (("uniform", "autoregressive"), ("uniform_teacher", "teacher")):
            if key == "uniform_teacher" and not model.config.feedback:
                continue
            preds = predict_decoded(model, held, decoding)
            result[key] = {"n": int(held.inputs.shape[0]),
                           "token_accuracy": float(token_accuracy(preds, held.targets)),
                           "sequence_accuracy": float(sequence_accuracy(preds, held.targets))}
            if task.cfg.old_items and key == "uniform":
                result["items"] = item_accuracy(preds, held.targets, task.cfg.old_items)
    if heldout.grid is not None:
        batch = grid_batch(task, heldout.grid)
        preds = predict_decoded(model, batch, "autoregressive").reshape(*heldout.grid.shape[:-1], -1)
        acc = grid_target_accuracy(preds, heldout.grid)  # (2, 2, L)
        result["grid"] = {f"{GROUP_NAMES[t]}/{GROUP_NAMES[d]}": float(acc[t, d].mean())
                          for t in (0, 1) for d in (0, 1)}
        result["grid_n_per_cell"] = int(heldout.grid.shape[2] * heldout.grid.shape[3])
    model.train(was_training)
    return result
