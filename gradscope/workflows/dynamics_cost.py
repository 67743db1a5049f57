"""The one estimate of what a dynamics run costs: seconds per part and bytes,
from the model's shape and declared Jacobian structure, before anything is allocated.

The model counts the calls each part makes (per step: forming J_t, products, decompositions, step
functions through autograd) and prices each kind at a rate measured on this workplace's 2-core CPU
with one torch thread (``python bench/realsize.py --calibrate`` prints the measurement; 2026-11-25):
BLAS-3 products ~100 GFLOP/s in float32 (half in float64); LAPACK eigenvalues, SVD and QR of small
matrices with their own d²·overhead; a step function through ``torch.func`` (vmap/jvp/vjp: many
small kernels) ~10 GFLOP/s of its own flops; a Python-level call ~30 µs. Those are the reference CPU's;
a :class:`~gradscope.analysis.cost.Rates` (``CoreShape.rates``, :mod:`gradscope.rates`) scales every time per
flop or number and every time per call to the machine that plans. ``bench/realsize.py`` compares the
estimate with the measured time on every shipped sample and the real-size models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gradscope.analysis.cost import MODULE_CALL, REFERENCE, Rates, products_seconds
from gradscope.analysis.lyapunov import BATCHES, running_snapshots
from gradscope.analysis.tape import KEEP_BYTES
from gradscope.models.structure import JacobianStructure

MATMUL32 = 1.0e-11  # s per float32 BLAS-3 flop (≈ 100 GFLOP/s, one thread)
MATMUL64 = 2.0e-11  # float64
ELEMENT = 5.0e-10  # s per element of elementwise work (forming an analytic J_t, norms of stored matrices)
NORM64 = 4.0e-9  # s per element of a norm accumulated in float64 (torch's vector_norm(dtype=float64), one
# thread: 34 ms for 8 × 128 × 8,192 float32 numbers against 1 ms in float32; the sums in float64)
STEP_FLOP = 1.0e-10  # s per flop of a step function under torch.func (vmap/jvp/vjp of small kernels)
CALL = 3.0e-5  # s per Python-level tensor call in a per-step loop
# the structured Lyapunov engine's step and block work, refitted 2026-11-28 to idle runs on the reference CPU:
# transformers Mamba (mamba-130m's size) 1,000 steps 33.8 s estimated, 67.6 s measured; RWKV-169m 25.0 / 35.9 s;
# gradscope's Mamba and S4D samples 1.0 / 1.2–1.4 s and 1.2 / 1.6 s (bench/README.md)
LYAP_STRUCTURED = 1.6
# s per Gaussian probe entry the estimators draw (in float64, then cast, so a float32 and a float64 model see the
# same probes): 118.5 M in 2.71 s on the reference CPU, one thread (2026-11-29; qwen3next-125m's gates, 8 × 16 ×
# 926,208 a step), 4.7× a float32 draw
RANDN64 = 2.3e-8
# s per entry of each product column the recurrent view (analysis.held) moves: the full state assembled around
# the recurrent entries and cut back out, and the column blocks transposed: 2.7–3.0 s a step against 1.2–1.9 s
# for the inner core's own step_tangents at 128 columns of 975,360 (qwen3next-125m, the reference CPU, one thread)
VIEW_COLUMN = 20 * ELEMENT
TAPE_NUMBERS = KEEP_BYTES // 4  # a state tape keeps every state below this many float32 numbers


def eig_seconds(d: int) -> float:
    """One d × d general eigenvalue decomposition (LAPACK geev)."""
    return 6e-10 * d ** 3 + 2.5e-8 * d * d


def svd_seconds(m: int, n: int) -> float:
    """Singular values of one m × n matrix."""
    lo, hi = min(m, n), max(m, n)
    # refitted 2026-11-28 to torch 2.13's svdvals and matrix_norm(ord=2), batched as the parts call
    # them, one thread on the reference CPU: 0.68 ms at 128 × 128, 1.34 ms at 128 × 256, 3.6 ms at 256 × 256,
    # 25 ms at 512 × 512 (the former fit, ×3 a bare call, priced these at 2–2.7× that)
    return 1.6e-10 * lo * lo * hi + 2e-8 * lo * hi + 5e-6


def eigh_seconds(d: int) -> float:
    """Eigenvalues of one symmetric d × d matrix."""
    return 8e-11 * d ** 3 + 5e-9 * d * d


def qr_seconds(d: int, k: int) -> float:
    """One float64 Householder QR of a d × k frame, Q formed."""
    return 2.8e-10 * d * k * k + 1e-8 * d * k


@dataclass(frozen=True)
class CoreShape:
    """What the estimate needs of a core: state width D, output width H, input width, gate terms,
    the declared structure, the flops of one step for one sequence, and whether J_t is analytic."""

    D: int
    H: int
    width: int
    gates: int
    structure: JacobianStructure
    step_flops: float
    analytic: bool
    modules: int = 1  # submodules of the core: a step call's Python overhead grows with them
    params: int = 0  # the core's parameters (0: step_flops / 2)
    fused: bool = False  # the core gives a step and its diagonal blocks from one pass (step_and_blocks)
    own: frozenset[str] = frozenset()  # products the core derives by hand (models.core.own_products)
    rates: Rates = REFERENCE  # the machine's rates against the constants' CPU (gradscope.rates.machine_rates)
    own_cost: tuple[tuple[str, float], ...] = ()  # the factors the core declares for them (models.core.own_cost)
    held: int = 0  # entries of D in held blocks (attention caches, analysis.held), at ``positions`` slots a cache
    positions: int = 0  # the attention caches' slots when the shape was taken

    @property
    def overhead(self) -> float:
        """Seconds of Python dispatch of one (batched) step call, whatever the batch."""
        return MODULE_CALL * self.modules * self.rates.call

    def products_seconds(self, kind: str, calls: int, columns: int, own: str | None = None) -> float:
        """``calls`` batched JVPs (kind "jvp") or VJPs ("vjp") through the step, ``columns`` columns (rows)
        each, all sequences of the batch together (:func:`gradscope.analysis.cost.products_seconds`).
        ``own``: the core's own product that runs them where it has it and declares its factor ("span": a
        span of steps pulled back at once), else the kind's."""
        own = own if own in self.own and own in dict(self.own_cost) else kind
        return products_seconds(kind, calls, columns, D=self.D, modules=self.modules,
                                params=self.params or self.step_flops / 2, step_flops=self.step_flops,
                                own=own in self.own, rates=self.rates, own_factor=dict(self.own_cost).get(own))

    def form_seconds(self) -> float:
        """Forming one J_t (D × D) for one sequence: analytic O(D²), else D reverse passes of a step."""
        c = self.rates.flop
        return (ELEMENT * c) * self.D * self.D if self.analytic else 3.0 * self.D * self.step_flops * (STEP_FLOP * c)

    def blocks_seconds(self) -> float:
        """The compact diagonal blocks of one J_t, one sequence."""
        c = self.rates.flop
        return (ELEMENT * c) * 4 * self.D + self.step_flops * (STEP_FLOP * c)


def part_seconds(shape: CoreShape, *, n: int, T: int, grid_sequences: int, sv: int, trajectories: int, steps: int,
                 exponents: int, flow_method: str) -> dict[str, float]:
    """Estimated seconds of each part for one checkpoint (flow, grid, spectra, gates, lyapunov), at the
    shape's rates (per flop ``c``, per call ``d``)."""
    D, H, s = shape.D, shape.H, shape.structure
    c, d = shape.rates.flop, shape.rates.call
    scan = n * T * shape.step_flops * (STEP_FLOP * c) + T * ((CALL * d) + shape.overhead)
    g = min(grid_sequences, n)
    spectral = c * svd_seconds(H, D) if D <= 2 * H else 2.0 * H * H * D * (MATMUL32 * c) + c * eigh_seconds(H)
    if flow_method == "structured":
        flow_step = (ELEMENT * c) * 10 * H * D + shape.blocks_seconds()  # G · diag, complex views, a norm
    elif flow_method == "jacobian":
        flow_step = shape.form_seconds() + 2.0 * H * D * D * (MATMUL32 * c)
    else:
        flow_step = 3.0 * H * shape.step_flops * (STEP_FLOP * c)
    out = {"flow": scan + n * T * (flow_step + spectral + (NORM64 * c) * H * D) + 6 * T * (CALL * d) + 3 * T * shape.overhead}
    if s.is_diagonal:
        out["grid"] = scan + g * T * T / 2 * (ELEMENT * c) * 4 * D + g * T * shape.blocks_seconds() + T * 4 * (CALL * d)
        out["spectra"] = scan + n * T * (shape.blocks_seconds() + (ELEMENT * c) * 40 * D) + T * 4 * (CALL * d)  # sorts
        out["gates"] = scan + n * T * (shape.blocks_seconds() + (ELEMENT * c) * D) * max(shape.gates, 1) + T * 2 * (CALL * d)
    else:
        eig = sum(c * eig_seconds(b.width) if b.form == "dense" else (ELEMENT * c) * 4 * b.width for b in s.blocks)
        out["grid"] = scan + g * T * shape.form_seconds() + g * T * T / 2 * (2.0 * D ** 3 * (MATMUL32 * c) + (ELEMENT * c) * D * D)
        out["spectra"] = scan + n * T * (shape.form_seconds() + eig + c * svd_seconds(D, D)) + T * 4 * (CALL * d)
        out["gates"] = scan + n * T * shape.gates * (shape.form_seconds() + (ELEMENT * c) * D * D) + T * 2 * (CALL * d)
    out["lyapunov"] = lyapunov_seconds(shape, trajectories, steps, exponents)
    return out


def estimator_seconds(shape: CoreShape, *, n: int, T: int, grid_sequences: int, sv: int, probes: int,
                      iterations: int) -> dict[str, float]:
    """Seconds of the matrix-free estimators (:mod:`gradscope.analysis.estimators`) for one checkpoint,
    for the parts that have one on this core: JVPs and VJPs through the step (:meth:`CoreShape.products_seconds`)."""
    if shape.structure.is_diagonal:
        return {}
    s = shape.structure
    c, d = shape.rates.flop, shape.rates.call
    scan = n * T * shape.step_flops * (STEP_FLOP * c) + T * ((CALL * d) + shape.overhead)
    g = min(grid_sequences, n)
    # grid: at step `end` one JVP of every running start's probes (g · probes · (end − 1) columns)
    grid_products = sum(shape.products_seconds("jvp", 1, g * probes * (end - 1)) for end in range(2, T + 1))
    draws = RANDN64 * c  # a probe entry drawn
    view = VIEW_COLUMN * c * shape.D if shape.held else 0.0  # per product column of a part run on the recurrent view
    out = {"grid": scan + grid_products + g * T * T / 2 * probes * (ELEMENT * c) * shape.D + T * 8 * (CALL * d)
           + g * T * probes * shape.D * draws,
           # flow: one reverse chain of n · probes rows; the state tape scans once more for long runs
           "flow": 2 * scan + shape.products_seconds("vjp", T, n * min(probes, shape.H), own="span") + n * T * probes * (ELEMENT * c) * shape.D
           + T * 6 * (CALL * d)}
    if not s.is_dense:  # the radius from the blocks, exactly; the singular values by subspace iteration
        width = min(shape.D, sv + 8)
        eig = sum(c * eig_seconds(b.width) if b.form == "dense" else (ELEMENT * c) * 4 * b.width for b in s.blocks)
        out["spectra"] = scan + (iterations + 1) * (shape.products_seconds("jvp", T, n * width)
                                                    + shape.products_seconds("vjp", T, n * width)) \
            + n * T * (eig + shape.blocks_seconds()) + T * (iterations + 1) * 6 * (CALL * d) \
            + n * T * width * shape.D * draws + (iterations + 1) * 2 * T * n * width * view
    if shape.gates == 1 and not shape.analytic:  # the one term J_t: Hutchinson
        out["gates"] = scan + shape.products_seconds("jvp", T, n * probes) + T * 4 * (CALL * d) \
            + n * T * probes * (shape.D * draws + view)
    return out


def lyapunov_seconds(shape: CoreShape, trajectories: int, steps: int, exponents: int) -> float:
    """:func:`gradscope.analysis.lyapunov.lyapunov_spectrum` over ``trajectories`` × ``steps``, the top
    ``exponents`` (a structured core: all, from its blocks)."""
    m, S, D, k, s = trajectories, steps, shape.D, exponents, shape.structure
    c, d = shape.rates.flop, shape.rates.call
    per = shape.step_flops * (STEP_FLOP * c) + 6 * (CALL * d) / m  # the state's own step, and the loop
    held = 0.0
    if shape.held:  # a recurrent view (analysis.held): caches of the trajectory's length, one scan to fill them
        full = D - shape.held + shape.held * max(S, shape.positions) / max(shape.positions, 1)
        held = m * S * (shape.step_flops * (STEP_FLOP * c) + (ELEMENT * c) * 2 * full) + S * shape.overhead \
            + m * S * (ELEMENT * c) * 4 * full  # and a step's full state assembled, then cut, at every step
    if not s.is_dense:
        per = LYAP_STRUCTURED * (shape.step_flops * (STEP_FLOP * c)) + 2 * (CALL * d) / m  # a lighter loop
        per += LYAP_STRUCTURED * ((ELEMENT * c) * 4 * shape.D if shape.fused else shape.blocks_seconds())
        for b in s.blocks:
            if b.held:  # not the view's: the engine never sees it
                continue
            w = b.width
            if b.form == "dense":
                per += 2.0 * w ** 3 * (MATMUL64 * c) + c * qr_seconds(w, w)
            elif b.form == "block_diagonal":
                per += (w // (b.size * b.repeat)) * (2.0 * b.size ** 3 * (MATMUL64 * c) + c * qr_seconds(b.size, b.size)) \
                    + (ELEMENT * c) * w * b.size / b.repeat  # the distinct blocks, converted for the QR
            else:  # a repeated diagonal's accumulator holds one value a group
                per += (ELEMENT * c) * 4 * (w // (b.size if b.form == "diagonal" else 1))
        return m * S * per + S * shape.overhead + held  # one step call a step (3 were priced once: 6× long on minGRU)
    per_call = 3 * S * shape.overhead
    if k == D or shape.analytic:
        per += shape.form_seconds() + 2.0 * D * D * k * (MATMUL64 * c)
    else:
        per += k * 1.5 * shape.step_flops * (STEP_FLOP * c)
    return m * S * (per + c * qr_seconds(D, k)) + per_call + held


def part_bytes(shape: CoreShape, *, n: int, T: int, grid_sequences: int, sv: int, trajectories: int, steps: int,
               exponents: int, flow_method: str, methods: dict[str, str] | None = None,
               probes: int = 16) -> tuple[dict[str, int], dict[str, int]]:
    """(working set, results kept) of each part for one checkpoint, 8 bytes a number (generously). The
    structured Lyapunov engine holds each block's own frame, never D × D."""
    D, H, s = shape.D, shape.H, shape.structure
    chunk, g, k = min(n, 64), min(grid_sequences, n), min(sv, D)
    m, S, e = trajectories, steps, exponents
    square = D if s.is_diagonal else D * D  # one step Jacobian's numbers (grid, spectra and gates form it)
    if s.is_dense:
        lyap_square, frame = D * D, D * e
    else:  # the structured engine: each block's own frame, never D × D
        lyap_square = sum(b.width * (b.width if b.form == "dense" else b.size if b.form == "block_diagonal" else 1)
                          // (b.size if b.form == "diagonal" else b.repeat) for b in s.blocks)  # a group's one value
        frame = lyap_square
    rows = chunk * (3 * H * D if flow_method != "structured" else 2 * H * D)
    work = {"flow": chunk * T * (D + 2) + rows + (chunk * D * D if flow_method == "jacobian" else 0),
            "grid": g * T * (T + 2 * square), "spectra": n * (T * (1 + k) + 3 * square),
            "gates": n * (T * (shape.gates + D) + 2 * shape.gates * square),
            "lyapunov": m * (S * (shape.width + 2) + 2 * lyap_square + 4 * frame + (running_snapshots(S, e) + 12) * e
                             + (0 if s.is_dense else BATCHES * lyap_square))}  # a structure's per-batch sums
    estimated = methods or {}
    if estimated.get("flow") == "estimate":  # probes rows, a few copies, and the tape's states
        work["flow"] = n * 4 * probes * D + min(n * T * D, TAPE_NUMBERS + n * 2 * (math.isqrt(T) + 1) * D)
    if estimated.get("grid") == "estimate":  # the pushed probe vectors, T × probes × D a sequence
        work["grid"] = g * T * (T + (probes + 2) * D)
    if estimated.get("spectra") == "estimate":  # subspace blocks of k + 8 vectors, a few copies
        work["spectra"] = n * (T * (1 + k) + 6 * (k + 8) * D + T * D)
    if estimated.get("gates") == "estimate":
        work["gates"] = n * (T * (shape.gates + D) + 2 * probes * D)
    kept = {"flow": 2 * n * T, "grid": g * T * T, "spectra": n * T * (1 + k), "gates": n * T * shape.gates,
            "lyapunov": m * (2 * running_snapshots(S, e) + 8) * e}
    return {p: 8 * (2 * n * T + work[p]) for p in work}, {p: 8 * kept[p] for p in kept}

PROCESS_BYTES = 400 * 2**20  # the interpreter with torch, xarray and zarr loaded (measured maxrss: ~350 MB)
