"""Held-out evaluation of a model (predictions in bounded chunks, no gradients)."""

from __future__ import annotations

from typing import Any

import torch

from gradscope.analysis.accuracy import grid_target_accuracy, sequence_accuracy, token_accuracy
from gradscope.models import SeqModel
from gradscope.tasks import GROUP_NAMES, HeldOut, Task, grid_batch


@torch.no_grad()
def predict(model: SeqModel, inputs: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Argmax predictions (n, T) for inputs (n, T), computed ``chunk`` rows at a time."""
    device = next(model.parameters()).device
    out = [model(inputs[i:i + chunk].to(device)).argmax(-1).cpu() for i in range(0, inputs.shape[0], chunk)]
    return torch.cat(out) if out else inputs.new_empty(inputs.shape)


def evaluate_heldout(model: SeqModel, task: Task, heldout: HeldOut) -> dict[str, Any]:
    """Token and sequence accuracy on the uniform held-out set; target accuracy per grid cell."""
    was_training = model.training
    model.eval()
    result: dict[str, Any] = {}
    if heldout.uniform.inputs.shape[0]:
        preds = predict(model, heldout.uniform.inputs)
        result["uniform"] = {"n": int(heldout.uniform.inputs.shape[0]),
                             "token_accuracy": float(token_accuracy(preds, heldout.uniform.targets)),
                             "sequence_accuracy": float(sequence_accuracy(preds, heldout.uniform.targets))}
    if heldout.grid is not None:
        batch = grid_batch(task, heldout.grid)
        preds = predict(model, batch.inputs).reshape(*heldout.grid.shape[:-1], -1)
        acc = grid_target_accuracy(preds, heldout.grid)  # (2, 2, L)
        result["grid"] = {f"{GROUP_NAMES[t]}/{GROUP_NAMES[d]}": float(acc[t, d].mean())
                          for t in (0, 1) for d in (0, 1)}
        result["grid_n_per_cell"] = int(heldout.grid.shape[2] * heldout.grid.shape[3])
    model.train(was_training)
    return result
