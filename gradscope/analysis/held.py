"""The recurrent layers' own step, with the attention caches along the trajectory held as inputs.

A model with attention layers (a hybrid, a transformer) declares its caches as *held* blocks of the state
(:attr:`gradscope.models.structure.StateBlock.held`). Stability and the gradient flow use the whole state.
The step map of a growing cache is not square, so the step spectra, the gate norms and the Lyapunov
spectrum are defined on the recurrent blocks only: J_t restricted to them, ∂z_t^rec/∂z_{t−1}^rec, with
every cache entry held at its value along the trajectory.

:func:`recurrent_view` builds that as an ordinary protocol core, so every dynamics engine runs on it
unchanged. Its state is the recurrent entries in their order. Its inputs are the model's inputs plus one
column, the sequence's row in a table of the caches at the end of the trajectory. Step t reads only
cache slots < t, which already hold their final values, and writes slot t itself, so the final caches
stand for the caches at every step. The engines may repeat a batch (columns riding in it), and a row
carries its own table index, so the right caches follow it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gradscope.models.core import Core, initial_state, step_and_blocks, step_at
from gradscope.models.structure import JacobianStructure, StateBlock, structure_of


def held_blocks(core: nn.Module) -> tuple[StateBlock, ...]:
    """The core's held blocks (attention caches), in state order; empty for a purely recurrent core."""
    return tuple(b for b in structure_of(core).blocks if b.held)


def held_names(core: nn.Module) -> str:
    """One line naming the held blocks (``l1/keys, l1/values``), or "" when there are none."""
    return ", ".join(b.name for b in held_blocks(core))


class RecurrentView(Core):
    """A core's recurrent blocks as a core of their own (the module docstring); built by :func:`recurrent_view`."""

    name = "recurrent-view"
    label = "recurrent layers, attention caches held"
    position_dependent = True

    def __init__(self, inner: nn.Module, caches: Tensor) -> None:
        super().__init__()
        self.inner = inner
        structure = structure_of(inner)
        self._own = [b for b in structure.blocks if not b.held]
        self._held = [b for b in structure.blocks if b.held]
        self._own_at = [i for i, b in enumerate(structure.blocks) if not b.held]
        dev = caches.device
        cat = lambda bs: torch.cat([torch.arange(b.start, b.stop, device=dev) for b in bs])  # noqa: E731
        self.register_buffer("keep", cat(self._own), persistent=False)
        self.register_buffer("caches", caches, persistent=False)  # (sequences, held entries)
        self._runs = _runs(self._own)  # the recurrent entries as runs of consecutive indices: slices, not gathers
        self._held_runs = _runs(self._held)
        self.state_dim = int(self.keep.numel())
        self.out_dim = int(inner.out_dim)
        self.gate_names = ("step",)
        start, blocks = 0, []
        for b in self._own:
            blocks.append(StateBlock(b.name, start, start + b.width, b.form, b.size, b.repeat))
            start += b.width
        self._structure = JacobianStructure(tuple(blocks))
        if callable(getattr(inner, "step_tangents", None)):  # the inner core's hand-derived forward mode, restricted
            self.step_tangents = self._step_tangents

    def _place(self, parts: list[tuple[Tensor, list[tuple[int, int]]]], lead: tuple[int, ...], like: Tensor
               ) -> Tensor:
        """A full-width state (lead…, inner D) from (values (lead…, n), their runs in the inner state) pairs, the
        rest zero: one concatenation of slices (a gather over a real-size state is several times slower, and an
        in-place write would not go through torch.func's transforms)."""
        pieces: list[tuple[int, int, Tensor]] = []
        for values, runs in parts:
            at = 0
            for a, b in runs:
                pieces.append((a, b, values[..., at:at + b - a]))
                at += b - a
        out, at = [], 0
        for a, b, piece in sorted(pieces, key=lambda p: p[0]):
            if a > at:
                out.append(like.new_zeros(*lead, a - at))
            out.append(piece)
            at = b
        if at < int(self.inner.state_dim):
            out.append(like.new_zeros(*lead, int(self.inner.state_dim) - at))
        return torch.cat(out, dim=-1)

    def _own_of(self, full: Tensor) -> Tensor:
        """The recurrent entries of a full-width state (…, inner D), in order."""
        return torch.cat([full[..., a:b] for a, b in self._runs], dim=-1)

    def _full(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """(the inner core's input, its full state) from the view's input and recurrent state."""
        rows = x[:, -1].round().long()
        full = self._place([(z, self._runs), (self.caches[rows], self._held_runs)], (z.shape[0],), z)
        return x[:, :-1], full

    def step(self, x: Tensor, z: Tensor, t: int | None = None) -> tuple[Tensor, Tensor]:
        xi, full = self._full(x, z)
        y, new = self.inner.step(xi, full, t) if getattr(self.inner, "position_dependent", False) else \
            self.inner.step(xi, full)
        return y, self._own_of(new)

    def _step_tangents(self, x: Tensor, z: Tensor, dz: Tensor, t: int | None = None,
                       out: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The inner core's own ``step_tangents`` on the full state, tangents zero on the held caches, restricted
        to the recurrent entries (:func:`gradscope.models.core.step_tangents`'s shapes; ``out`` is not used).
        Set as ``step_tangents`` only where the inner core has its own, so the plans price it as such."""
        xi, full = self._full(x, z)
        dfull = self._place([(dz, self._runs)], tuple(dz.shape[:2]), dz)
        y, new, dy, dnew = self.inner.step_tangents(xi, full, dfull, t)
        return y, self._own_of(new), dy, self._own_of(dnew)

    def jacobian_structure(self) -> JacobianStructure:
        return self._structure

    def state_layout(self) -> dict[str, slice]:
        return {b.name: slice(b.start, b.stop) for b in self._structure.blocks}

    def diagonal_blocks(self, x: Tensor, z: Tensor, t: int | None = None) -> list[Tensor]:
        return self.step_and_blocks(x, z, t)[1]

    def step_and_blocks(self, x: Tensor, z: Tensor, t: int | None = None) -> tuple[Tensor, list[Tensor]]:
        xi, full = self._full(x, z)
        new, blocks = step_and_blocks(self.inner, xi, full, t)
        return self._own_of(new), [blocks[i] for i in self._own_at]

    def init_state(self, batch: int, like: Tensor) -> Tensor:
        return self._own_of(initial_state(self.inner, batch, like))


def _runs(blocks: list[StateBlock]) -> list[tuple[int, int]]:
    """The blocks' index ranges, adjacent ones merged: [(start, stop), …] in state order."""
    runs: list[tuple[int, int]] = []
    for b in blocks:
        if runs and runs[-1][1] == b.start:
            runs[-1] = (runs[-1][0], b.stop)
        else:
            runs.append((b.start, b.stop))
    return runs


def recurrent_view(core: nn.Module, x: Tensor) -> tuple[RecurrentView, Tensor]:
    """(the view of ``core``'s recurrent blocks, its inputs (B, T, in + 1)) for the inputs x (B, T, in): the
    caches are the core's after x, each row's own (module docstring)."""
    with torch.no_grad():
        z = initial_state(core, x.shape[0], x)
        for t in range(x.shape[1]):  # one state at a time: a long trajectory's (B, T, D) would not fit
            z = step_at(core, x[:, t], z, t)[1]
    view = RecurrentView(core, torch.empty(0, device=x.device))
    view.caches = torch.cat([z[:, a:b] for a, b in view._held_runs], dim=1)
    rows = torch.arange(x.shape[0], device=x.device, dtype=x.dtype)[:, None, None].expand(-1, x.shape[1], 1)
    return view, torch.cat([x, rows], dim=-1)


__all__ = ["RecurrentView", "held_blocks", "held_names", "recurrent_view"]
