"""The states before every step of a sequence without keeping T × D of them.

:class:`StateTape` gives z_0 … z_{T−1} (the state before each step, as
:func:`gradscope.analysis.dynamics.previous_states`) in any order. A short run keeps them all (the
same tensor as ``previous_states``); a long one keeps every ``every``-th state (a checkpoint) and, when
a state of another segment is read, recomputes that segment's states from its checkpoint with the same
``step`` calls the first scan made, so every state is bit-identical to the kept one. Memory is
O((T/every + every)·B·D) instead of O(T·B·D): with every = ⌈√T⌉, 2·√T states. A sweep in either
direction costs one extra scan.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from gradscope.models.core import initial_state, step_at

KEEP_BYTES = 256 * 2**20  # below this, B·T·D states are simply kept (one tensor, as previous_states returns them)


class StateTape:
    """z_0 … z_{T−1} of ``core`` on inputs x (B, T, in), read with ``tape[t]`` → (B, D).

    every: keep every ``every``-th state and recompute the others by segment (None: keep all when
    B·T·D numbers take at most ``keep_bytes``, else ⌈√T⌉). ``final`` is z_T. Run it under
    ``torch.no_grad()`` where no graph is wanted; the tape never builds one of its own."""

    def __init__(self, core: nn.Module, x: Tensor, *, every: int | None = None, keep_bytes: int = KEEP_BYTES) -> None:
        B, T = x.shape[0], x.shape[1]
        self.core, self.x, self.T = core, x, T
        D = core.state_dim
        if every is None:
            every = T if B * T * D * x.element_size() <= keep_bytes else max(1, math.isqrt(T - 1) + 1)
        self.every = max(1, min(int(every), T))
        z = initial_state(core, B, x)
        marks, kept = [], []
        for t in range(T):
            if t % self.every == 0:
                marks.append(z)
            if self.every == T:
                kept.append(z)
            z = step_at(core, x[:, t], z, t)[1]
        self.final = z
        self._marks = marks
        self._segment = 0 if self.every == T else -1
        self._states: list[Tensor] = kept

    @property
    def kept(self) -> int:
        """States held now (checkpoints and the current segment): the tape's memory in units of B × D."""
        return len(self._marks) + (len(self._states) if self.every < self.T else 0)

    def __len__(self) -> int:
        return self.T

    def __getitem__(self, t: int) -> Tensor:
        if not 0 <= t < self.T:
            raise IndexError(f"step {t} outside [0, {self.T})")
        segment = t // self.every
        if segment != self._segment:
            start = segment * self.every
            z, states = self._marks[segment], []
            for s in range(start, min(start + self.every, self.T)):
                states.append(z)
                if s + 1 < min(start + self.every, self.T):
                    z = step_at(self.core, self.x[:, s], z, s)[1]
            self._segment, self._states = segment, states
        return self._states[t - segment * self.every]

    def stacked(self) -> Tensor:
        """All T states as one (B, T, D) tensor: what the tape exists to avoid, for callers that ask."""
        return torch.stack([self[t] for t in range(self.T)], dim=1)


def state_at(prev: Tensor | StateTape, t: int) -> Tensor:
    """The state before step t from a (B, T, D) tensor of them or a :class:`StateTape`."""
    return prev[t] if isinstance(prev, StateTape) else prev[:, t]
