"""The core protocol every recurrent core follows, and the functional scan they share.

A *core* is an ``nn.Module`` with

- ``state_dim`` (D): the real width of the full recurrent state z (every layer; LSTM h and c;
  complex SSM states as real numbers, ``torch.view_as_real`` layout);
- ``out_dim`` (H): the width of the output y_t;
- ``step(x (B, in), z (B, D)) → (y (B, H), z' (B, D))``: one functional step on the flat real state.

That is all the generic Jacobian engines (``vjp``, ``func``) need; any module with these three works
with them, whoever wrote it. A core may also provide, and gradscope's own cores do:

- ``readout(x, z)``: y_t from the state z_t right after step t and that step's input x_t (needed
  for a Jacobian at p = T);
- ``state_layout()``: names of the slices of z (``h1``, ``c1``, ``modes1`` …), for labels;
- ``complex_state``: True when z is the real view of complex numbers (S4D), which adds the
  conjugate-Wirtinger scores;
- ``analytic_unsupported()`` / ``analytic_jacobian(x, zs, p)``: a fast hand-derived engine;
- ``step_jacobian(x, z)``: the step Jacobian J_t = ∂z_t/∂z_{t−1} (docs/definitions.md §7), and
  ``gate_terms(x, z)``: J_t split into one term per path through the cell (keys ``gate_names``);
- ``recurrent_blocks()``: each gate's block of W_hh, a static reference for the step spectra;
- ``jacobian_structure()`` / ``diagonal_blocks(x, z)``: J_t block lower-triangular with diagonal,
  complex-diagonal, per-head or dense blocks (:mod:`gradscope.models.structure`), which the
  dynamics engines exploit (exact O(D) Lyapunov spectra for diagonal blocks);
- ``step_jvp(x, z, V)``: J_t · V (B, D, k) without forming J_t (the partial Lyapunov spectra, the
  step spectra's estimators), and ``step_tangents(x, z, dz, t, out=None)``: the step with its
  forward-mode products, (y, z', dy, dz') for tangents dz (m, B, D) (the stability sketch's chain;
  :func:`step_tangents`), and ``step_cotangents(x, z, gz, t)``: gz · ∂z'/∂z for rows gz (r, B, D)
  (the gradient flow's reverse chain; :func:`step_cotangents`); ``chain_tangents(x, z, dz, t)``: the last
  output of L steps over x (B, L, in) and its tangents, where a core can do a span at once
  (:func:`chain_tangents`), and ``span_cotangents(x, z, gz, sumsq, t)``: rows pulled back through L steps with
  the squared norm of the rows before each (:func:`span_cotangents`);
- ``init_state(batch, like)``: the state every scan, probe and trajectory starts from (default zero;
  e.g. RWKV's running maximum starts at −1e30);
- ``position_dependent = True`` with ``step(x, z, t)``: the step also reads its 0-based time index t
  (RecurrentGemma resets its recurrence at t = 0). Every engine passes t to such a core
  (:func:`step_at`); its own ``step_jacobian``/``diagonal_blocks``/``gate_terms`` take ``t=`` too.

The module functions :func:`step_jacobian`, :func:`gate_terms` and :func:`diagonal_blocks` take any protocol core: a core
without the methods (a user's) gets the generic ``torch.func`` Jacobian.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import nn

from gradscope.models.structure import JacobianStructure, structure_of


@dataclass(frozen=True)
class NoSettings:
    """The config of a core with no settings beyond the shared sizes."""


class Core(nn.Module):
    """Base class of gradscope's cores: what a registered core declares, and defaults for the optional
    parts of the protocol. Everything else in gradscope (config checks, ``gradscope train`` options,
    sweep axes, report labels, summary fields, dynamics estimates, the tests' tiny models) is derived
    from these declarations and the registry (:mod:`gradscope.models.registry`)."""

    name: ClassVar[str] = "core"  # registry name
    label: ClassVar[str] = "core"  # how reports write it
    # Its own settings: a frozen dataclass; fields made with gradscope.fields.option(...) become
    # training options (--<name>), summary fields and label short names.
    Config: ClassVar[type] = NoSettings
    # Settings of a test-sized model (a few hidden units) whose Jacobians stay far from 0.
    tiny_config: ClassVar[dict[str, Any]] = {}
    complex_state: ClassVar[bool] = False
    gate_names: ClassVar[tuple[str, ...]] = ("step",)  # keys of gate_terms, in report order
    state_dim: int
    out_dim: int

    @classmethod
    def token_floats(cls, hidden_size: int, config: Any) -> int:
        """Floats per token and layer that a training step keeps for the backward pass beyond the
        shared estimate (a few H-wide activations): e.g. a selective scan's E × N state per step."""
        return 0

    @classmethod
    def check_steps(cls, config: Any, steps: int) -> None:
        """Refuse (GradscopeError, naming the setting) own settings that make no sense for sequences
        of ``steps`` steps, before a run starts (e.g. a convolution wider than the sequence)."""

    @classmethod
    def build(cls, input_size: int, hidden_size: int, num_layers: int, config: Any) -> "Core":
        """The core of a :class:`~gradscope.models.config.ModelConfig`: input width, hidden size H,
        layers and its own ``Config``."""
        raise NotImplementedError(f"{cls.__name__} does not say how to build it")

    def step(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def readout(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y_t from z_t (B, D) and x_t (B, in) → (B, H). Cores without one cannot be analysed at p = T."""
        raise NotImplementedError

    def state_layout(self) -> dict[str, slice]:
        """Named slices of the flat state z."""
        return {"z": slice(0, self.state_dim)}

    def analytic_unsupported(self) -> str | None:
        """Why the analytic engine cannot handle this core (None when it can)."""
        return f"it does not know {type(self).__name__}"

    def analytic_jacobian(self, x: torch.Tensor, zs: torch.Tensor, p: int) -> torch.Tensor:
        """J = ∂y_T/∂z_p from the inputs x (B, T, in) and scanned states zs (B, T, D) → (B, H, D)."""
        raise NotImplementedError

    def step_jacobian(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """J_t = ∂z_t/∂z_{t−1} of one step from its input x (B, in) and the state before it z (B, D)
        → (B, D, D), rows the new state, columns the old. Generic: ``torch.func`` (D reverse passes
        per sequence); gradscope's cores override it with an analytic form."""
        return generic_step_jacobian(self, x, z)

    def gate_terms(self, x: torch.Tensor, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """J_t as a sum of terms, one per path through the cell, each (B, D, D), keyed by
        ``gate_names``; they sum to :meth:`step_jacobian`. Generic: the one term ``step``."""
        return {"step": self.step_jacobian(x, z)}

    def recurrent_blocks(self) -> dict[str, torch.Tensor]:
        """Each gate's block of the recurrent weights, ``"l<layer>/<gate>"`` → (H, H); empty for
        cores without recurrent weight matrices."""
        return {}

    def jacobian_structure(self) -> JacobianStructure | None:
        """How J_t is built (:mod:`gradscope.models.structure`); None: one dense block."""
        return None

    def diagonal_blocks(self, x: torch.Tensor, z: torch.Tensor) -> list[torch.Tensor]:
        """J_t's own block of each declared state block, compact (see :mod:`gradscope.models.structure`).
        Generic: ``torch.func`` restricted to each block (its width in reverse passes)."""
        return generic_diagonal_blocks(self, x, z)

    def init_state(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        """The zero state (B, D), on ``like``'s device and dtype."""
        return like.new_zeros(batch, self.state_dim)

    def scan(self, x: torch.Tensor, z0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`scan` of this core."""
        return scan(self, x, z0)

    # --- initial state and time index: see the module docstring ---------------------------------
    position_dependent: ClassVar[bool] = False  # True: step(x, z, t) also reads the 0-based time index


def initial_state(core: nn.Module, batch: int, like: torch.Tensor) -> torch.Tensor:
    """The state (B, D) a scan starts from: the core's ``init_state(batch, like)`` where it has one,
    else zero; on ``like``'s device and dtype."""
    method = getattr(core, "init_state", None)
    z = method(batch, like) if callable(method) else like.new_zeros(batch, core.state_dim)
    return z.to(device=like.device, dtype=like.dtype)


def step_at(core: nn.Module, x: torch.Tensor, z: torch.Tensor, t: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``core.step(x, z)``; for a ``position_dependent`` core ``core.step(x, z, t)`` with the step's
    0-based time index t (the step that reads the sequence's (t+1)-th input)."""
    if getattr(core, "position_dependent", False):
        if t is None:
            raise TypeError(f"{type(core).__name__} is position-dependent: its step needs the time index t")
        return core.step(x, z, t)
    return core.step(x, z)


def _own_method(core: nn.Module, name: str):  # noqa: ANN202 - a bound method or None
    """The core's own ``name`` method; None when it has none or only inherits :class:`Core`'s generic one."""
    method = getattr(core, name, None)
    if not callable(method) or getattr(type(core), name, None) is getattr(Core, name):
        return None
    return method


def _call_own(core: nn.Module, method, x: torch.Tensor, z: torch.Tensor, t: int | None):  # noqa: ANN001, ANN202
    return method(x, z, t=t) if getattr(core, "position_dependent", False) else method(x, z)


def scan(core: nn.Module, x: torch.Tensor, z0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Functional recurrence of any protocol core. x (B, T, in) → (outputs (B, T, H), states after
    each step (B, T, D)). The state starts at ``z0``, else at the core's initial state
    (:func:`initial_state`); step t reads x[:, t] at time index t."""
    z = initial_state(core, x.shape[0], x) if z0 is None else z0
    ys, zs = [], []
    for t in range(x.shape[1]):
        y, z = step_at(core, x[:, t], z, t)
        ys.append(y)
        zs.append(z)
    return torch.stack(ys, dim=1), torch.stack(zs, dim=1)


def generic_step_jacobian(core: nn.Module, x: torch.Tensor, z: torch.Tensor, t: int | None = None) -> torch.Tensor:
    """∂z_t/∂z_{t−1} of any protocol core by ``vmap`` over the batch of ``jacrev`` of its step:
    x (B, in), z (B, D) → (B, D, D). Costs D vector-Jacobian products of the step per sequence.
    t: the step's time index (position-dependent cores only)."""
    def new_state(xi: torch.Tensor, zi: torch.Tensor) -> torch.Tensor:
        return step_at(core, xi[None], zi[None], t)[1][0]  # the step is written for a batch: give it one of 1

    return torch.func.vmap(torch.func.jacrev(new_state, argnums=1))(x, z)


def generic_diagonal_blocks(core: nn.Module, x: torch.Tensor, z: torch.Tensor,
                            t: int | None = None) -> list[torch.Tensor]:
    """J_t's own block of each state block of ``core``'s declared structure, by ``vmap(jacrev)`` of the
    step restricted to that block (n reverse passes for a block of width n), in compact form:
    diagonal (B, n); complex_diagonal (B, n/2) complex, a + ib from the 2 × 2 block [[a, −b], [b, a]];
    block_diagonal (B, n/size, size, size); dense (B, n, n)."""
    out = []
    for blk in structure_of(core).blocks:
        def block_state(xi: torch.Tensor, zb: torch.Tensor, zi: torch.Tensor, lo: int = blk.start,
                        hi: int = blk.stop) -> torch.Tensor:
            full = torch.cat([zi[:lo], zb, zi[hi:]])
            return step_at(core, xi[None], full[None], t)[1][0, lo:hi]

        J = torch.func.vmap(torch.func.jacrev(block_state, argnums=1))(x, z[:, blk.start:blk.stop], z)  # (B, n, n)
        B, n = J.shape[0], blk.width
        if blk.form == "diagonal":
            out.append(J.diagonal(dim1=1, dim2=2))
        elif blk.form == "complex_diagonal":
            pairs = J.view(B, n // 2, 2, n // 2, 2).diagonal(dim1=1, dim2=3)  # (B, 2, 2, n/2)
            out.append(torch.complex(pairs[:, 0, 0], pairs[:, 1, 0]))
        elif blk.form == "block_diagonal":
            s = blk.size
            out.append(J.view(B, n // s, s, n // s, s).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2))
        else:
            out.append(J)
    return out


def diagonal_blocks(core: nn.Module, x: torch.Tensor, z: torch.Tensor, t: int | None = None) -> list[torch.Tensor]:
    """J_t's own block of each declared state block (compact; :func:`generic_diagonal_blocks`): the
    core's own ``diagonal_blocks`` where it has one, else the generic ``torch.func`` form. t: the
    step's time index (position-dependent cores only)."""
    method = _own_method(core, "diagonal_blocks")
    return generic_diagonal_blocks(core, x, z, t) if method is None else _call_own(core, method, x, z, t)


def step_and_blocks(core: nn.Module, x: torch.Tensor, z: torch.Tensor,
                    t: int | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(z_t, :func:`diagonal_blocks`) of one step: from one pass where the core has its own
    ``step_and_blocks`` (the library adapters: the blocks come from the step's intermediates, so a
    real-size step is not run twice), else ``step`` and ``diagonal_blocks``."""
    method = getattr(core, "step_and_blocks", None)
    if callable(method):
        return _call_own(core, method, x, z, t)
    return step_at(core, x, z, t)[1], diagonal_blocks(core, x, z, t)


def generic_step_tangents(core: nn.Module, x: torch.Tensor, z: torch.Tensor, dz: torch.Tensor,
                     t: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step and its forward-mode products by ``torch.func``: x (B, in), z (B, D), tangents dz
    (m, B, D) → (y (B, H), z' (B, D), dy (m, B, H), dz' (m, B, D)); the primal runs once (``vmap``
    over the m tangents of ``jvp``)."""
    def one(v: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        return torch.func.jvp(lambda a: step_at(core, x, a, t), (z,), (v,))

    (y, new), (dy, dnew) = torch.func.vmap(one, out_dims=((None, None), (0, 0)))(dz)
    return y, new, dy, dnew


def step_tangents(core: nn.Module, x: torch.Tensor, z: torch.Tensor, dz: torch.Tensor, t: int | None = None,
                  out: tuple[torch.Tensor, torch.Tensor] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, z', ∂y/∂z · dz, ∂z'/∂z · dz) of one step for tangents dz (m, B, D) (:func:`generic_step_tangents`'s
    shapes): the core's own hand-derived ``step_tangents`` where it has one (transformers' Mamba: the
    selective-scan update with its m tangents in place, the primal's and tangents' matrix products in
    one call), else :func:`generic_step_tangents`. t: the step's time index (position-dependent cores only).
    ``out``: buffers shaped like (z, dz), neither of them z or dz, that a core's own method may write
    z' and dz' into (a chain alternates two, so a real-size state is not allocated anew each step)."""
    method = getattr(core, "step_tangents", None)
    return method(x, z, dz, t, out=out) if callable(method) else generic_step_tangents(core, x, z, dz, t)


def chain_tangents(core: nn.Module, x: torch.Tensor, z: torch.Tensor, dz: torch.Tensor, start: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The last output of the steps over x (B, L, in) from z (B, D), and its forward-mode products for
    tangents dz (m, B, D) on z: (y_L (B, H), ∂y_L/∂z · dz (m, B, H)). The core's own ``chain_tangents``
    where it has one (transformers' Mamba-2: the span layer by layer in the SSD form), else
    :func:`step_tangents` chained L times, alternating two buffers. start: the first step's time index
    (position-dependent cores)."""
    method = getattr(core, "chain_tangents", None)
    if callable(method):
        return method(x, z, dz, start)
    own = callable(getattr(core, "step_tangents", None))  # only a core's own method writes into the buffers
    spare = [(torch.empty_like(z), torch.empty_like(dz)) if own else None for _ in range(2)]
    for k in range(x.shape[1]):  # each step's outputs go to the buffer its inputs are not in
        y, z, dy, dz = step_tangents(core, x[:, k], z, dz, start + k, out=spare[k % 2])
    return y, dy


def generic_step_cotangents(core: nn.Module, x: torch.Tensor, z: torch.Tensor, gz: torch.Tensor,
                            t: int | None = None) -> torch.Tensor:
    """gz · ∂z'/∂z of one step by ``torch.func.vjp``, the r rows riding in the batch: x (B, in), z (B, D),
    cotangent rows gz (r, B, D) on z' → (r, B, D)."""
    r, B, D = gz.shape
    xr, zr = x.repeat(r, 1), z.repeat(r, 1)  # row-major: row j of sequence b at j·B + b
    _, pullback = torch.func.vjp(lambda s: step_at(core, xr, s, t)[1], zr)
    return pullback(gz.reshape(r * B, D))[0].reshape(r, B, D)


def step_cotangents(core: nn.Module, x: torch.Tensor, z: torch.Tensor, gz: torch.Tensor,
                    t: int | None = None) -> torch.Tensor:
    """gz · ∂z'/∂z for cotangent rows gz (r, B, D) on the step's new state: the core's own hand-derived
    ``step_cotangents`` where it has one (transformers' Mamba), else :func:`generic_step_cotangents`."""
    method = getattr(core, "step_cotangents", None)
    return method(x, z, gz, t) if callable(method) else generic_step_cotangents(core, x, z, gz, t)


def span_cotangents(core: nn.Module, x: torch.Tensor, z: torch.Tensor, gz: torch.Tensor,
                    sumsq: Callable[[torch.Tensor], torch.Tensor], start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Cotangent rows gz (r, B, D) on the state after the steps over x (B, L, in) from z (B, D), pulled back
    through the L steps: (the rows on z (r, B, D), sq (r, B, L) float64, sq[..., k] = ``sumsq`` of the rows
    on the state before step k). The core's own ``span_cotangents`` where it has one (transformers'
    Mamba-2: layer by layer over the span), else the states run forward from z and
    :func:`step_cotangents` chained back. start: the first step's time index."""
    method = getattr(core, "span_cotangents", None)
    if callable(method):
        return method(x, z, gz, sumsq, start)
    L = x.shape[1]
    zs = [z]
    for k in range(L - 1):
        zs.append(step_at(core, x[:, k], zs[-1], start + k)[1])
    sq = torch.zeros(*gz.shape[:2], L, dtype=torch.float64, device=gz.device)
    for k in range(L - 1, -1, -1):
        gz = step_cotangents(core, x[:, k], zs[k], gz, start + k)
        sq[..., k] = sumsq(gz)
    return gz, sq


def weight_count(core: nn.Module) -> int:
    """Weights a step of ``core`` multiplies by: its parameters outside embeddings (each tensor once; a
    wrapped library backbone holds its token embedding, which a step never multiplies by)."""
    skip = {id(p) for m in core.modules() if isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)}
    seen: dict[int, int] = {}
    for p in core.parameters():
        if id(p) not in skip:
            seen[id(p)] = p.numel()
    return sum(seen.values())


def own_products(core: nn.Module) -> frozenset[str]:
    """The products ``core`` derives by hand: "jvp" (its own ``step_tangents``), "vjp" (``step_cotangents``),
    "chain" (``chain_tangents``, a span of steps at once), "span" (``span_cotangents``, a span of steps
    back at once); the plans price them apart
    (:data:`gradscope.analysis.cost.OWN_FACTOR`, :func:`own_cost`)."""
    names = {"jvp": "step_tangents", "vjp": "step_cotangents", "chain": "chain_tangents", "span": "span_cotangents"}
    return frozenset(kind for kind, name in names.items() if callable(getattr(core, name, None)))


def own_cost(core: nn.Module) -> dict[str, float]:
    """The cost factors a core declares for its own products (class attribute ``own_cost``, e.g.
    ``{"vjp": 0.074}``: the hand-derived product's time against the generic price of a step's products at
    the same size, measured where the core was written; "chain": its ``chain_tangents`` against the
    generic price of the whole tangent chain, flops and products); the plans use the general factors for
    the kinds it leaves out (:data:`gradscope.analysis.cost.OWN_FACTOR`)."""
    declared = getattr(core, "own_cost", None) or {}
    return {kind: float(declared[kind]) for kind in own_products(core) if kind in declared}


def step_jacobian(core: nn.Module, x: torch.Tensor, z: torch.Tensor, t: int | None = None) -> torch.Tensor:
    """J_t = ∂z_t/∂z_{t−1} (B, D, D) of any protocol core from x (B, in) and z (B, D): the core's own
    ``step_jacobian`` where it has one (a user's core may not), else :func:`generic_step_jacobian`.
    t: the step's time index (position-dependent cores only)."""
    method = _own_method(core, "step_jacobian")
    return generic_step_jacobian(core, x, z, t) if method is None else _call_own(core, method, x, z, t)


def gate_terms(core: nn.Module, x: torch.Tensor, z: torch.Tensor, t: int | None = None) -> dict[str, torch.Tensor]:
    """J_t split by path through the cell, name → (B, D, D), summing to :func:`step_jacobian`: the
    core's own ``gate_terms`` where it has one, else the single term ``step``."""
    method = _own_method(core, "gate_terms")
    return {"step": step_jacobian(core, x, z, t)} if method is None else _call_own(core, method, x, z, t)


def scaled_rows(coef: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_k diag(coef[:, k]) W_k: coef (B, K, H), w (K·H, n) → (B, H, n), formed elementwise."""
    blocks = w.view(coef.shape[1], coef.shape[2], -1)  # (K, H, n)
    out = torch.mul(coef[:, 0, :, None], blocks[0], out=out)
    for k in range(1, coef.shape[1]):
        out.addcmul_(coef[:, k, :, None], blocks[k])
    return out
