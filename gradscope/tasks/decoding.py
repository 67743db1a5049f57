"""Output-phase decoding of a feedback model (paper App. B.2, Fig. 8).

A feedback model (``ModelConfig(feedback=True)``) reads, at each output step after the first, the
token of the step before it as id K + 1 + token (the query token K stays the "dummy" input of the
first output step). Two ways to choose that token:

- ``teacher``: the ground truth (teacher forcing; how the paper trained its autoregressive LSTM,
  and its "Ground Truth-Conditioned" accuracy);
- ``autoregressive``: the model's own argmax prediction at the step before (its "Autoregressive"
  accuracy; greedy decoding, one step at a time through the core's functional step).

Which positions are fed back is read from the data's layout, never from its values: position t is
fed when its input is the query token and position t − 1 is scored (its target is not IGNORE).
"""

from __future__ import annotations

import torch

from gradscope.errors import check
from gradscope.models.core import scan
from gradscope.models.seq import SeqModel
from gradscope.tasks.base import IGNORE

MODES = ("teacher", "autoregressive")


def feedback_positions(inputs: torch.Tensor, targets: torch.Tensor, query: int) -> torch.Tensor:
    """Bool (B, T): True where position t reads the token of position t − 1 (an output step that
    follows a scored output step)."""
    fed = torch.zeros_like(inputs, dtype=torch.bool)
    fed[:, 1:] = (inputs[:, 1:] == query) & (targets[:, :-1] != IGNORE)
    return fed


def teacher_inputs(inputs: torch.Tensor, targets: torch.Tensor, query: int) -> torch.Tensor:
    """Inputs (B, T) with the ground truth fed back: id query + 1 + targets[t − 1] at every fed
    position (:func:`feedback_positions`)."""
    fed = feedback_positions(inputs, targets, query)
    previous = torch.zeros_like(targets)
    previous[:, 1:] = targets[:, :-1]
    return torch.where(fed, query + 1 + previous.clamp(min=0), inputs)


def _check(model: SeqModel, mode: str) -> None:
    check(model.config.feedback, "decoding: this model has no feedback input (train it with --decoding teacher "
                                 "or autoregressive)")
    check(mode in MODES, f"decoding: got {mode!r}; valid values are {', '.join(MODES)}")


def decode_logits(model: SeqModel, inputs: torch.Tensor, targets: torch.Tensor, mode: str) -> torch.Tensor:
    """Logits (B, T, K) of a feedback model on inputs/targets (B, T), the output phase fed by
    ``mode`` (teacher or autoregressive). Autoregressive: the steps before the first fed position run
    as one functional scan, then one core step per position, each fed position reading
    K + 1 + argmax of the logits before it. Differentiable (the argmax is a choice, not a path)."""
    _check(model, mode)
    K = model.config.vocab_size
    if mode == "teacher":
        return model(teacher_inputs(inputs, targets, K))
    fed = feedback_positions(inputs, targets, K)
    T = inputs.shape[1]
    columns = torch.nonzero(fed.any(0)).flatten()
    start = int(columns[0]) if columns.numel() else T
    core = model.core
    ys, zs = scan(core, model.core_inputs(inputs[:, :start]))  # position 0 is never fed: start >= 1
    logits = [model.to_logits(ys)]  # (B, start, K)
    z = zs[:, -1]
    current = inputs.clone()
    for t in range(start, T):
        previous = logits[-1][:, -1].argmax(-1)  # (B,) the prediction at t − 1
        current[:, t] = torch.where(fed[:, t], K + 1 + previous, inputs[:, t])
        x = model.core_inputs(current[:, :t + 1])[:, t]  # (B, in): PE at position t
        y, z = core.step(x, z)
        logits.append(model.to_logits(y)[:, None])
    return torch.cat(logits, dim=1)


@torch.no_grad()
def decode(model: SeqModel, inputs: torch.Tensor, targets: torch.Tensor, mode: str, chunk: int = 1024) -> torch.Tensor:
    """Argmax predictions (n, T) of a feedback model, ``mode`` teacher or autoregressive, ``chunk``
    rows at a time on the model's device."""
    _check(model, mode)
    device = next(model.parameters()).device
    out = [decode_logits(model, inputs[i:i + chunk].to(device), targets[i:i + chunk].to(device), mode).argmax(-1).cpu()
           for i in range(0, inputs.shape[0], chunk)]
    return torch.cat(out) if out else inputs.new_empty(inputs.shape)
