"""Lyapunov spectra of a driven recurrence z_t = step(x_t, z_{t−1}) (docs/definitions.md §7): dense, partial and
structure-aware engines behind one function, :func:`lyapunov_spectrum`.

- **dense / partial** (Benettin/QR): a D × k orthonormal frame Q (k = D: the full spectrum; k < D:
  the top k exponents) advanced by M = J_t ⋯ J_s · Q and re-orthonormalised by a Householder QR,
  λ_i = mean log|R_ii|. Full and partial runs are the same loop: in exact arithmetic the first k
  columns of a Householder QR depend only on the first k columns of its input, so the k run equals
  the top k of the full run column for column. J_t · Q is formed either from the explicit J_t (the
  core's analytic ``step_jacobian``: O(D²) to form, 2D²k to apply) or, for a core without one,
  without forming J_t: k forward-mode products (``torch.func.jvp``) through ``core.step``, or the
  core's own ``step_jvp(x, z, V)`` (O(k · step)).
- **structured**: for a core that declares its step Jacobian block lower-triangular with diagonal
  blocks (``jacobian_structure()``, :mod:`gradscope.models.structure`), the spectrum is the union of
  the blocks' spectra; a diagonal block's exponents are the time averages of log|diagonal entry|
  (exact, O(D) per step), a dense or per-head block's come from Benettin/QR on that block alone.

Precision. J_t may stay in the model's dtype; J_t · Q, the QR and the log-sums run in ``qr_dtype``
(float64 by default; a float32 QR puts a GRU's tail off by ~0.1, measured in docs/dynamics.md).

−∞ and "below resolution". An exponent whose R_ii is exactly zero at some counted QR (a column that
the step maps to zero: an unread shift-register entry, a gate saturated at 0) is −inf, and so is Σλ.
One whose |R_ii| falls to the QR's floor, ``10·D·eps·‖R‖_F`` (eps of ``qr_dtype``; Householder QR's
backward error is O(D·eps·‖M‖_F), and ‖M‖_F = ‖R‖_F), at any counted QR is below what the QR can resolve: at that step its true value may be zero (then the
exponent is −∞) and rounding put eps-sized numbers in its place (a nilpotent shift register of
width 2 shows up as two exponents near log(eps)/2 = −18 in float64, the floor landing on each column
every other step). Its measured mean is then only an upper bound: it is flagged in
``below_resolution`` and never averaged as a measured value.

Error bars. Each trajectory's counted window is cut into ``batches`` non-overlapping blocks of
consecutive QRs (equal within one QR block); the exponent is the step-weighted mean of the blocks'
means, and its batch-means standard error is sqrt(b/(b−1) · Σ_j w_j² (m_j − λ)²), w_j = n_j / N
(``se_batch``, (B, k)). Across independent trajectories the standard error of the mean is the spread
of the per-trajectory exponents over sqrt(B) (:meth:`LyapunovResult.se_trajectories`), and the
running estimate carries the same (:meth:`LyapunovResult.running_se`). Convergence: the mean of the
second half of the blocks minus that of the first (``drift``), against the pooled within-half
spread of the block means; |t| > ``DRIFT_T`` flags the exponent ``unconverged`` (a transient still in
the window, or a trend). With 10 blocks the t has 8 degrees of freedom: a stationary exponent is
flagged about 0.4% of the time. −∞ and NaN exponents carry NaN errors and are never flagged.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gradscope.analysis.reduce import fro64
from gradscope.errors import check
from gradscope.models.core import Core, initial_state, step_and_blocks, step_at, step_jacobian
from gradscope.models.structure import JacobianStructure, StateBlock, structure_of

ENGINES = ("auto", "dense", "structured")
BATCHES = 10  # blocks of the batch-means error bars: 10 is the textbook compromise of bias and variance
DRIFT_T = 4.0  # |t| of the second-half − first-half drift above which an exponent is flagged unconverged
APPLY = ("auto", "jacobian", "jvp")
FRAME_APPLY = "auto"  # how J_t · Q is formed unless told: chosen per core and k (frame_method)


@dataclass(frozen=True)
class LyapunovResult:
    """Lyapunov exponents per trajectory, natural log per time step, float64 on the inputs' device.

    exponents (B, k), sorted descending (k = D unless fewer were asked for); −inf where exact,
    an upper bound where ``below_resolution`` (B, k) is True (module docstring). running (B, C, k): the
    estimate after ``running_steps[c]`` counted steps (sorted at each checkpoint; flags are judged
    over the whole window only, so running estimates carry none). log_det_mean (B,): mean
    log|det J_t| over the counted steps when asked for (``sum_check=True``; a float64 LU of each J_t),
    else None — with every exponent (k = D) resolved, Σ_i exponents[:, i] equals it. It is −inf exactly
    when some J_t is singular in the model's dtype (a gate saturated to 0, an unread state entry):
    then the matching exponents are −inf or flagged below resolution. engine: "dense", "partial" or
    "structured"; structure: the declared structure in one line.
    """

    exponents: Tensor
    running: Tensor
    running_steps: Tensor
    log_det_mean: Tensor | None
    warmup: int
    reorth: int
    below_resolution: Tensor | None = None
    engine: str = "dense"
    structure: str = "dense"
    se_batch: Tensor | None = None
    drift: Tensor | None = None
    unconverged: Tensor | None = None
    batches: int = 0

    def se_trajectories(self) -> Tensor:
        """(k,) standard error of the mean over trajectories of each exponent: sample sd / sqrt(B);
        NaN with fewer than 2 trajectories or where an exponent is not finite."""
        return _spread_se(self.exponents)

    def running_se(self) -> Tensor:
        """(C, k) the same for the running estimate at each of ``running_steps``."""
        return _spread_se(self.running)

    @property
    def resolved(self) -> Tensor:
        """(B, k) bool: finite exponents measured above resolution (what averages may use)."""
        flags = self.below_resolution if self.below_resolution is not None else torch.zeros_like(self.exponents, dtype=torch.bool)
        return torch.isfinite(self.exponents) & ~flags

    def sum(self) -> Tensor:
        """Σλ per trajectory (B,): −inf when any exponent is −inf; with exponents below resolution the
        sum is an upper bound (see ``below_resolution``)."""
        return self.exponents.sum(-1)


def _blocks(T: int, warmup: int, reorth: int) -> list[int]:
    """Step counts at which a QR happens: every ``reorth`` steps, one also at T_warm (so the counted
    window starts exactly there), and at T."""
    ends = list(range(reorth, warmup, reorth)) + ([warmup] if warmup else [])
    return ends + list(range(warmup + reorth, T, reorth)) + [T]


def analytic_jacobian(core: nn.Module) -> bool:
    """Whether the core forms J_t by its own (hand-derived) ``step_jacobian``."""
    own = getattr(type(core), "step_jacobian", None)
    return own is not None and own is not Core.step_jacobian


_analytic = analytic_jacobian


def frame_method(core: nn.Module, k: int, apply: str = FRAME_APPLY) -> str:
    """How J_t · Q (D × k) is formed: "jacobian" (explicit J_t, then a product in the QR's dtype) or
    "jvp" (k forward-mode products through the step in the QR's dtype, J_t never formed). auto:
    "jacobian" for the full spectrum and for any core with an analytic (hand-derived) J_t — forming
    it costs O(D²), far below the O(D³) the full spectrum pays, and the k run then uses the very
    Jacobians of the full run, so its exponents are the full run's top k; "jvp" for a core without
    one (its generic J_t would cost D reverse passes)."""
    check(apply in APPLY, f"apply: got {apply!r}; valid values are {', '.join(APPLY)}")
    if apply != "auto":
        return apply
    return "jacobian" if k == core.state_dim or _analytic(core) else "jvp"


def _frame_applier(core: nn.Module, method: str, qr_dtype: torch.dtype):
    """fn(x (B, in), z (B, D), Q (B, D, k), t) → J_t Q (B, D, k) in ``qr_dtype`` (t: the time index)."""
    if method == "jacobian":
        return lambda x, z, Q, t: torch.bmm(step_jacobian(core, x, z, t).to(qr_dtype), Q)
    own = getattr(core, "step_jvp", None)
    if callable(own):
        if getattr(core, "position_dependent", False):
            return lambda x, z, Q, t: own(x, z, Q, t=t).to(qr_dtype)
        return lambda x, z, Q, t: own(x, z, Q).to(qr_dtype)
    sample = next(iter(core.parameters()), None)
    twin = core if sample is None or sample.dtype == qr_dtype else copy.deepcopy(core).to(qr_dtype)

    def apply(x: Tensor, z: Tensor, Q: Tensor, t: int) -> Tensor:
        xq, zq = x.to(qr_dtype), z.to(qr_dtype)

        def one(v: Tensor) -> Tensor:  # one tangent column (B, D) → J v (B, D)
            return torch.func.jvp(lambda s: step_at(twin, xq, s, t)[1], (zq,), (v,))[1]
        return torch.func.vmap(one, in_dims=2, out_dims=2)(Q)
    return apply


class _Accumulator:
    """log|R_ii| sums of one Benettin frame (B, k), with the below-resolution test, the running
    estimate and the per-block sums of the batch-means error bars; one per frame (the dense frame, or
    each dense / per-head block of a structure, or a diagonal block's exact log|d| sums)."""

    def __init__(self, shape: tuple[int, ...], D: int, qr_dtype: torch.dtype, device: torch.device,
                 batches: int = 1) -> None:
        self.logs = torch.zeros(shape, dtype=torch.float64, device=device)
        self.small = torch.zeros(shape, dtype=torch.bool, device=device)  # hit the QR's floor at a counted step
        self.tol = 10 * D * torch.finfo(qr_dtype).eps
        self.block_logs = torch.zeros((batches, *shape), dtype=torch.float64, device=device)
        self.block_steps = [0] * batches

    def add(self, a: Tensor, block: int = 0, steps: int = 1) -> None:
        """One counted QR over ``steps`` steps of batch ``block``, from geqrf's output a (..., n, k): R is
        its upper triangle."""
        r = a.diagonal(dim1=-2, dim2=-1).abs().double()  # (..., k)
        scale = fro64(a[..., :r.shape[-1], :].triu())[..., None]  # ‖R‖_F, float64 sums
        self.add_logs(r.log(), block, steps)
        self.small |= r <= self.tol * scale

    def add_logs(self, logs: Tensor, block: int = 0, steps: int = 1) -> None:
        """Counted log-moduli (shape of the frame) of ``steps`` steps of batch ``block``."""
        self.logs += logs
        self.block_logs[block] += logs
        self.block_steps[block] += steps

    def final(self, counted: int) -> tuple[Tensor, Tensor]:
        """(exponents, below_resolution) before sorting: a flagged exponent's value is an upper bound."""
        exps = self.logs / counted
        return exps, self.small & torch.isfinite(exps)

    def errors(self) -> tuple[Tensor, Tensor, Tensor]:
        """(se_batch, drift, unconverged) before sorting (module docstring); blocks without steps are left out."""
        used = [j for j, n in enumerate(self.block_steps) if n > 0]
        sums = self.block_logs[used]  # (b, ...)
        n = torch.tensor([self.block_steps[j] for j in used], dtype=torch.float64, device=sums.device)
        n = n.reshape(-1, *([1] * (sums.dim() - 1)))
        b, N = len(used), float(n.sum())
        means = sums / n  # (b, ...)
        lam = sums.sum(0) / N
        nan = torch.full_like(lam, float("nan"))
        if b < 2:
            return nan, nan, torch.zeros_like(lam, dtype=torch.bool)
        dev = torch.where(torch.isfinite(lam), means - lam, torch.nan)
        se = (b / (b - 1) * ((n / N) ** 2 * dev ** 2).sum(0)).sqrt()
        if b < 4:
            return se, nan, torch.zeros_like(lam, dtype=torch.bool)
        h = b // 2  # an odd middle block belongs to neither half
        first, second = means[:h], means[b - h:]
        m1, m2 = first.mean(0), second.mean(0)
        drift = torch.where(torch.isfinite(lam), m2 - m1, torch.nan)
        pooled = (((first - m1) ** 2).sum(0) + ((second - m2) ** 2).sum(0)) / (2 * h - 2)
        spread = (pooled * 2 / h).sqrt()  # standard error of m2 − m1
        floor = 1e-12 * (1 + lam.abs())  # an exactly constant series has no spread: flag only a real drift
        unconverged = drift.abs() > DRIFT_T * spread + floor
        return se, drift, unconverged & torch.isfinite(drift)


def _spread_se(values: Tensor) -> Tensor:
    """Standard error of the mean over axis 0 of (B, ...): sample sd / sqrt(B); NaN where B < 2 or not finite."""
    B = values.shape[0]
    if B < 2:
        return torch.full_like(values[0], float("nan"))
    se = values.std(0, correction=1) / B ** 0.5
    return torch.where(torch.isfinite(values).all(0), se, torch.nan)


RUNNING_NUMBERS = 1 << 25  # the running estimate's history keeps at most this many numbers a trajectory (256 MiB)
RUNNING_EVERY = 10  # counted steps between running estimates (lyapunov_spectrum's checkpoint_every), unless thinned


def running_every(counted: int, k: int, every: int = RUNNING_EVERY) -> int:
    """The running estimate's interval over ``counted`` steps for ``k`` exponents: ``every``, widened to a
    multiple of it when the history (one snapshot of k an interval) would pass :data:`RUNNING_NUMBERS` a
    trajectory. Every model with k × counted/every below 33.5 M keeps every ``every`` steps; mamba2-130m's
    4.8 M exponents over 1,000 steps are kept every 200."""
    snapshots = max(1, RUNNING_NUMBERS // max(k, 1) - 1)  # the end adds one
    need = -(-counted // snapshots)  # the least interval that fits
    return max(every, -(-need // every) * every)


def running_snapshots(counted: int, k: int, every: int = RUNNING_EVERY) -> int:
    """How many running estimates :func:`lyapunov_spectrum` keeps over ``counted`` steps for ``k`` exponents
    (at most; a QR block of several steps may skip one): the plans' memory model."""
    return counted // running_every(counted, k, every) + 1


def _block_of(counted_end: int, counted: int, batches: int) -> int:
    """The batch (0 … batches−1) a QR ending ``counted_end`` counted steps into a window of ``counted`` falls in."""
    return min(batches - 1, (counted_end - 1) * batches // counted)


def lyapunov_spectrum(core: nn.Module, inputs: Tensor, *, warmup: int, reorth: int = 1, z0: Tensor | None = None,
                      checkpoint_every: int = RUNNING_EVERY, sum_check: bool = False, exponents: int | None = None,
                      qr_dtype: torch.dtype = torch.float64, engine: str = "auto", apply: str = FRAME_APPLY,
                      batches: int = BATCHES) -> LyapunovResult:
    """Lyapunov exponents of the driven recurrence z_t = step(x_t, z_{t−1}) (docs/definitions.md §7).

    core: any protocol core. inputs: the vectors it reads (B, T, in), e.g. ``model.core_inputs`` of
    task-distributed tokens (:func:`gradscope.analysis.dynamics.trajectory_tokens`); B trajectories,
    run batched. The state starts at the core's initial state (zero unless the core's ``init_state``
    says otherwise) or ``z0`` (B, D); the ``warmup`` steps are run (the
    frame evolves) but not counted. exponents: the top k (default all D).
    engine: "structured" for a core that declares a block-triangular Jacobian (module docstring),
    "dense" (Benettin/QR on the full state), "auto" (structured when declared). apply: how J_t · Q
    is formed on the dense engine (:func:`frame_method`).
    reorth: QR every ``reorth`` steps on the product of that many Jacobians (the same exponents in
    exact arithmetic: R of a product is the product of the Rs); a QR also falls on step T_warm.
    A block of k = ``reorth`` steps resolves exponent i only while (λ_1 − λ_i)·k stays well below
    −log(eps) (36 in float64, 16 in float32): keep k = 1 for wide spectra.
    checkpoint_every: the running estimate every that many counted steps (rounded up to a QR) and at
    the end, widened by :func:`running_every` when the history of k exponents would be large.
    sum_check: also the mean log|det J_t| (float64 LU of each J_t, or of each block).
    batches: blocks of the counted window for the batch-means error bars and the drift test (module
    docstring; fewer when the window has fewer QRs).

    COST per trajectory and step: dense, full: forming J_t (O(D²) analytic) + J_t·Q (2D³) + QR
    ((8/3)D³ with forming Q); dense, top k: k·step (jvp) or O(D²) + 2D²k, + QR 4Dk²; structured:
    O(D) for diagonal blocks, the dense cost of each dense block on its own width. Memory O(B·D·k).
    """
    check(isinstance(inputs, Tensor) and inputs.dim() == 3 and inputs.is_floating_point(),
          f"inputs: expected float input vectors (B, T, in); got "
          f"{tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__}")
    B, T, _ = inputs.shape
    D = core.state_dim
    check(isinstance(warmup, int) and 0 <= warmup < T,
          f"warmup: got {warmup!r}; it must be an integer in [0, {T - 1}] (T = {T} steps)")
    check(isinstance(reorth, int) and reorth >= 1, f"reorth: got {reorth!r}; it must be a positive integer")
    check(isinstance(checkpoint_every, int) and checkpoint_every >= 1,
          f"checkpoint_every: got {checkpoint_every!r}; it must be a positive integer")
    check(z0 is None or (isinstance(z0, Tensor) and tuple(z0.shape) == (B, D)),
          f"z0: expected a state (B, D) = ({B}, {D}); got {tuple(z0.shape) if isinstance(z0, Tensor) else z0!r}")
    structure = structure_of(core)
    own = spectrum_width(structure)  # the held attention caches are inputs, not state, here
    k = own if exponents is None else exponents
    check(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= own,
          f"exponents: got {exponents!r}; it must be an integer in [1, {own}] (the "
          f"{'recurrent ' if own < D else ''}state width) or None for all")
    check(qr_dtype in (torch.float32, torch.float64), f"qr_dtype: got {qr_dtype}; expected torch.float32 or torch.float64")
    check(engine in ENGINES, f"engine: got {engine!r}; valid values are {', '.join(ENGINES)}")
    check(isinstance(batches, int) and not isinstance(batches, bool) and batches >= 1,
          f"batches: got {batches!r}; it must be a positive integer (10: the default)")
    checkpoint_every = running_every(T - warmup, k, checkpoint_every)
    if engine == "auto":
        engine = "dense" if structure.is_dense else "structured"
    check(engine == "structured" or own == D,
          f"engine: {type(core).__name__}'s attention caches grow with the position, so its step map is not square; "
          f"its spectrum is the recurrent layers' own, with the caches held as inputs: use engine='structured'")
    with torch.no_grad():
        z = initial_state(core, B, inputs) if z0 is None else z0.to(inputs)
        if engine == "structured":
            return _structured(core, inputs, z, structure, warmup, reorth, checkpoint_every, sum_check, k, qr_dtype,
                               batches)
        return _dense(core, inputs, z, warmup, reorth, checkpoint_every, sum_check, k, qr_dtype,
                      frame_method(core, k, apply), structure, batches)


def _dense(core: nn.Module, x: Tensor, z: Tensor, warmup: int, reorth: int, checkpoint_every: int, sum_check: bool,
           k: int, qr_dtype: torch.dtype, method: str, structure: JacobianStructure, batches: int) -> LyapunovResult:
    B, T, _ = x.shape
    D = core.state_dim
    advance = _frame_applier(core, method, qr_dtype)
    Q = torch.eye(D, k, dtype=qr_dtype, device=x.device).expand(B, D, k).contiguous()  # Q_0 = first k columns of I
    M = Q
    a, tau = torch.empty_like(Q), Q.new_empty(B, k)  # the last QR, Householder form: R on/above a's diagonal
    acc = _Accumulator((B, k), D, qr_dtype, x.device, batches)
    log_det = torch.zeros(B, dtype=torch.float64, device=x.device) if sum_check else None
    running, running_steps, mark, start = [], [], checkpoint_every, 0
    for end in _blocks(T, warmup, reorth):
        for t in range(start, end):  # 0-based t: the step that reads x[:, t]
            if log_det is not None and t >= warmup:
                log_det += torch.linalg.slogdet(step_jacobian(core, x[:, t], z, t).double()).logabsdet
            M = advance(x[:, t], z, Q if t == start else M, t)
            z = step_at(core, x[:, t], z, t)[1]
        torch.geqrf(M, out=(a, tau))
        Q = torch.linalg.householder_product(a, tau)
        if end > warmup:
            counted = end - warmup
            acc.add(a, _block_of(counted, T - warmup, batches), end - start)
            if counted >= mark or end == T:
                running.append(acc.logs / counted)
                running_steps.append(counted)
                mark = (counted // checkpoint_every + 1) * checkpoint_every
        start = end
    exps, flags = acc.final(T - warmup)
    return _result(exps, flags, running, running_steps, log_det, T - warmup, warmup, reorth,
                   "dense" if k == D else "partial", structure.describe(), errors=acc.errors(), batches=batches)


def _result(exps: Tensor, flags: Tensor, running: list[Tensor], running_steps: list[int], log_det: Tensor | None,
            counted: int, warmup: int, reorth: int, engine: str, structure: str, k: int | None = None, *,
            errors: tuple[Tensor, Tensor, Tensor], batches: int) -> LyapunovResult:
    order = exps.sort(dim=-1, descending=True)
    keep = slice(None) if k is None else slice(0, k)
    se, drift, unconverged = (e.gather(-1, order.indices)[:, keep].contiguous() for e in errors)
    running_t = torch.stack(running, dim=1).sort(dim=-1, descending=True).values[..., keep]  # (B, C, k)
    return LyapunovResult(exponents=order.values[:, keep].contiguous(), running=running_t.contiguous(),
                          running_steps=torch.tensor(running_steps, dtype=torch.int64),
                          log_det_mean=None if log_det is None else log_det / counted, warmup=warmup, reorth=reorth,
                          below_resolution=flags.gather(-1, order.indices)[:, keep].contiguous(), engine=engine,
                          structure=structure, se_batch=se, drift=drift, unconverged=unconverged,
                          batches=batches)


def spectrum_width(structure: JacobianStructure) -> int:
    """How many exponents the spectrum has: the state's entries but those of held blocks (attention caches,
    which grow with the position: :attr:`~gradscope.models.structure.StateBlock.held`)."""
    return sum(b.width for b in structure.blocks if not b.held)


def _repeat(blk: StateBlock) -> int:
    """How many state entries each value of a block's accumulator stands for: a repeated diagonal's group
    (``size``), a repeated block's copies (``repeat``), a complex mode's two real entries, else 1."""
    if blk.form == "diagonal":
        return blk.size
    if blk.form == "block_diagonal":
        return blk.repeat
    return 2 if blk.form == "complex_diagonal" else 1


def _structured(core: nn.Module, x: Tensor, z: Tensor, structure: JacobianStructure, warmup: int, reorth: int,
                checkpoint_every: int, sum_check: bool, k: int, qr_dtype: torch.dtype, batches: int) -> LyapunovResult:
    """The union of the diagonal blocks' spectra (module docstring): diagonal forms exactly, dense and
    per-head blocks by Benettin/QR on their own width."""
    B, T, _ = x.shape
    dev = x.device
    own = [i for i, b in enumerate(structure.blocks) if not b.held]  # the held caches are inputs along the trajectory
    blocks = [structure.blocks[i] for i in own]
    width = sum(b.width for b in blocks)
    frames: list[Tensor | None] = []
    accs: list[_Accumulator] = []
    for blk in blocks:
        if blk.form == "dense":
            n = blk.width
            frames.append(torch.eye(n, dtype=qr_dtype, device=dev).expand(B, n, n).contiguous())
            accs.append(_Accumulator((B, n), n, qr_dtype, dev, batches))
        elif blk.form == "block_diagonal":  # one frame a distinct block: a repeated block's copies share it
            h, s = blk.width // (blk.size * blk.repeat), blk.size
            frames.append(torch.eye(s, dtype=qr_dtype, device=dev).expand(B, h, s, s).contiguous())
            accs.append(_Accumulator((B, h, s), s, qr_dtype, dev, batches))
        else:
            frames.append(None)  # exact: log|d| sums with no QR, hence no resolution limit
            accs.append(_Accumulator((B, blk.width // _repeat(blk)), 1, qr_dtype, dev, batches))
    products: list[Tensor | None] = list(frames)
    sizes: dict[int, list[int]] = {}  # block_diagonal frames by block size: one batched QR each
    qr_groups: list[list[int]] = []
    for i, blk in enumerate(blocks):
        if blk.form == "block_diagonal":
            sizes.setdefault(blk.size, []).append(i)
        elif frames[i] is not None:
            qr_groups.append([i])
    qr_groups += list(sizes.values())
    log_det = torch.zeros(B, dtype=torch.float64, device=dev) if sum_check else None
    running, running_steps, mark, start = [], [], checkpoint_every, 0

    def flat(values: list[Tensor]) -> Tensor:  # per-block (B, …) → (B, D) in state order
        return torch.cat([v.reshape(B, -1) for v in values], dim=-1)

    reps = [_repeat(b) for b in blocks]  # each accumulator value's multiplicity in the state

    def expanded(i: int, v: Tensor) -> Tensor:  # each accumulator value once per state entry it stands for
        return v.reshape(B, -1) if reps[i] == 1 else v.reshape(B, -1).repeat_interleave(reps[i], dim=-1)
    counts = torch.cat([torch.full((b.width // r,), r, dtype=torch.long, device=dev) for b, r in zip(blocks, reps)])

    def top(values: list[Tensor]) -> Tensor:  # the top k of the expanded state, descending, without expanding
        compact = torch.cat([v.reshape(B, -1) for v in values], dim=-1)
        if all(r == 1 for r in reps):
            return compact.topk(k, dim=-1).values
        order = compact.sort(dim=-1, descending=True)
        return torch.stack([order.values[b].repeat_interleave(counts[order.indices[b]])[:k] for b in range(B)])

    for end in _blocks(T, warmup, reorth):
        for t in range(start, end):
            z_next, diag = step_and_blocks(core, x[:, t], z, t)  # one pass where the core offers it
            counted_step = t >= warmup
            for i, (blk, d) in enumerate(zip(blocks, (diag[j] for j in own))):
                if blk.form in ("diagonal", "complex_diagonal"):
                    if counted_step:
                        one = d if blk.size == 1 else d.reshape(d.shape[0], -1, blk.size)[..., 0]  # a group's one value
                        logs = one.abs().double().log().expand(B, -1)
                        accs[i].add_logs(logs, _block_of(t - warmup + 1, T - warmup, batches))
                        if log_det is not None:  # a complex mode counts twice on the real view
                            log_det += float(_repeat(blk)) * logs.sum(-1)
                else:
                    if blk.repeat > 1:  # a repeated block's first copy
                        d = d.reshape(d.shape[0], -1, blk.repeat, blk.size, blk.size)[:, :, 0]
                    dq = d.to(qr_dtype)
                    if log_det is not None and counted_step:
                        log_det += _repeat(blk) * torch.linalg.slogdet(dq.double()).logabsdet.reshape(B, -1).sum(-1)
                    products[i] = dq @ (frames[i] if t == start else products[i])
            z = z_next
        for group in qr_groups:  # blocks of one size share one batched QR (a hybrid's heads: dozens a step)
            stacked = products[group[0]] if len(group) == 1 else torch.cat([products[i] for i in group], dim=1)
            a, tau = torch.geqrf(stacked)
            Q = torch.linalg.householder_product(a, tau)
            widths = [products[i].shape[1] for i in group]
            for i, qi, ai in zip(group, Q.split(widths, dim=1), a.split(widths, dim=1)):
                frames[i] = qi
                if end > warmup:
                    accs[i].add(ai, _block_of(end - warmup, T - warmup, batches), end - start)
        if end > warmup:
            counted = end - warmup
            if counted >= mark or end == T:
                # the top k only (what _result keeps): a history of all D at a real model's size is GBs
                running.append(flat([expanded(i, acc.logs) for i, acc in enumerate(accs)]) / counted
                               if k == width else top([acc.logs / counted for acc in accs]))
                running_steps.append(counted)
                mark = (counted // checkpoint_every + 1) * checkpoint_every
        start = end
    finals = [acc.final(T - warmup) for acc in accs]
    exps = flat([expanded(i, e) for i, (e, _) in enumerate(finals)])
    flags = flat([expanded(i, f) for i, (_, f) in enumerate(finals)])
    errs = [acc.errors() for acc in accs]
    errors = tuple(flat([expanded(i, e[j]) for i, e in enumerate(errs)]) for j in range(3))
    return _result(exps, flags, running, running_steps, log_det, T - warmup, warmup, reorth, "structured",
                   structure.describe(), k=None if k == width else k, errors=errors, batches=batches)


def lyapunov_flops(D: int, k: int, B: int, T: int, structure: JacobianStructure | None = None, apply: str = "jacobian",
                   step_flops: float | None = None) -> float:
    """Floating-point operations of :func:`lyapunov_spectrum` (the budget rule of the dynamics
    workflow): per trajectory and step, dense "jacobian": D² (form) + 2D²k + (8/3)·D·k² (QR);
    "jvp": k · step_flops (default 8·D² for an RNN step) + (8/3)·D·k²; structured: 4·D for the
    diagonal blocks + the dense cost of each dense or per-head block on its own width."""
    if structure is not None and not structure.is_dense:
        per = 0.0
        for blk in structure.blocks:
            n = blk.width
            if blk.form == "dense":
                per += n * n + 2 * n ** 3 + 8 / 3 * n ** 3
            elif blk.form == "block_diagonal":
                per += (n // (blk.size * blk.repeat)) * (2 + 8 / 3) * blk.size ** 3
            else:
                per += 4 * n
        return float(B) * T * per
    step = 8.0 * D * D if step_flops is None else step_flops
    apply_cost = D * D + 2.0 * D * D * k if apply == "jacobian" else k * step
    return float(B) * T * (apply_cost + 8 / 3 * D * k * k)


__all__ = ["APPLY", "BATCHES", "DRIFT_T", "ENGINES", "RUNNING_NUMBERS", "LyapunovResult", "analytic_jacobian",
           "frame_method", "lyapunov_flops", "lyapunov_spectrum", "running_every", "running_snapshots"]
