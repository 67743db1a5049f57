"""What a Jacobian–vector product through one step costs on this workplace's CPU: the
constants both plans use (stability's, :func:`gradscope.analysis.stability.plan_stability`, and dynamics',
:mod:`gradscope.workflows.dynamics_cost`), so one measured rate prices a product wherever it is planned.

A batched JVP or VJP through one step (torch.func) with c columns costs a fixed part per call (Python
dispatch per submodule of the core, and the weights read once: memory-bound at a few columns) plus a part
per column (its flops and its elementwise work on the D state numbers). Fitted 2026-11-25 to calls measured
on this CPU with one thread, from gradscope's Mamba sample (D = 1,536) to transformers Mamba at mamba-130m's
size (D = 700,416, 129 M parameters: a VJP of 1 row 0.097 s, of 8 rows 0.34 s; a JVP of 1 column 0.19 s, of
8 columns 0.33 s) and RWKV at 169m's (D = 46,080). ``python bench/realsize.py`` compares the plans built on
these with measured runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradscope.errors import GradscopeWarning


@dataclass(frozen=True)
class Rates:
    """How the machine that plans compares with the CPU the constants below were fitted on:
    ``compute`` multiplies every time per flop or per number (BLAS, LAPACK, elementwise work), ``dispatch``
    every time per call (Python and torch dispatch), ``load`` both (other processes sharing the cores).
    1.0 everywhere is the reference CPU, idle (:data:`REFERENCE`); :mod:`gradscope.rates` measures them."""

    compute: float = 1.0
    dispatch: float = 1.0
    load: float = 1.0
    source: str = "reference"  # how they were found: reference, measured (cached), pinned (GRADSCOPE_RATES)

    @property
    def flop(self) -> float:
        """The factor on a time per flop or per number."""
        return self.compute * self.load

    @property
    def call(self) -> float:
        """The factor on a time per call."""
        return self.dispatch * self.load

    def describe(self) -> str:
        """One line for a plan: how this machine's rates compare with the reference."""
        if (self.compute, self.dispatch, self.load) == (1.0, 1.0, 1.0) and self.source == "reference":
            return "the reference CPU's rates"
        load = f", load ×{self.load:.2g}" if self.load != 1.0 else ""
        return f"this machine's rates ({self.source}: compute ×{self.compute:.2g}, calls ×{self.dispatch:.2g}{load})"

    def scaled(self, factor: float) -> "Rates":
        """These rates with every time ``factor`` times longer (a run that measured itself slower)."""
        return Rates(self.compute * factor, self.dispatch * factor, self.load, f"{self.source}, corrected ×{factor:.2g}")


REFERENCE = Rates()
OVERRUN = 1.2  # the run-time watches' limit: a command may pass its time budget by at most this factor


class PlanWarning(GradscopeWarning):
    """The plan changed while running: the work measured slower than its estimate (another CPU, a busy one)."""

JVP_MODULE, VJP_MODULE = 2.5e-4, 6e-5  # s per submodule of the core, per call
JVP_WEIGHT, VJP_WEIGHT = 9e-10, 4e-10  # s per parameter, per call
JVP_COLUMN = (6.5e-11, 6e-9, 1e-5)  # s per (step flop, state number, column) of each column
VJP_COLUMN = (2e-11, 4e-8, 2e-5)  # as JVP_COLUMN; the last was once 1e-4, which priced gradscope's Mamba sample 2.6× long
VJP_CHUNK = 6_000_000  # a VJP call takes at most this many numbers (gradscope.analysis.estimators chunks its rows)
ROW_VJP = 1.2e-5  # s per cotangent row per step of a vmapped pullback (the exact Jacobian's reverse chain)
MODULE_CALL = 3.5e-5  # s per submodule of the core per step call (Python dispatch: 1.1 ms for a 2-layer HF Mamba)
# A core's own hand-derived products (``step_tangents``/``step_cotangents``: transformers' Mamba) against the
# torch.func ones at mamba-130m's size, measured end to end on this CPU with one thread (2026-11-26, machine
# loaded): the stability sketch's chain (6 sequences × 4 tangents × 31 steps) 8.4 → 4.2 s CPU, the estimated
# flow's (16 rows × 15 steps) 7.0–7.9 → 1.9–2.1 s; a hand-derived VJP takes every row at once (no chunks).
OWN_FACTOR = {"jvp": 0.5, "vjp": 0.3}
# The flop rate of a stability sketch's forward-mode products (matrix products of primal and tangents
# together, large chunks of sequences), float32, the machine's two threads: 87 GFLOP/s (mamba-130m) and
# 105 GFLOP/s (RWKV-169m) end to end on this CPU for 768 sequences × 5 columns × 31 steps (2026-11-26,
# idle); half of it in float64. The exact path keeps the nominal laptop rate.
# The sketch's whole estimate was refitted (flops at SKETCH_FLOPS, plus SKETCH_PRODUCTS × the products'
# own terms, which count part of the same work again) to the idle end-to-end runs of 2026-11-26: mamba-130m
# at 5 units 310 s and RWKV-169m at 9 units 325 s (the estimates were 566 s and 552 s, 1.8× and 1.7× long);
# the 4-unit runs (270 s and 194 s) then estimate at 254 s and 165 s. Measured again 2026-11-28 19:2x UTC
# on the same CPU, idle (bench/README.md): the same 4-unit commands took 663 s and 422 s, 2.5× and 2.4×
# those estimates, while the small-model probes of gradscope.rates read the machine as it was (×1): the
# real-size sketch streams GB-sized tangent chunks and is bound by memory, which the probes do not see.
# The sketch is priced at the slower of the two days (both terms ÷ 2.45): an estimate long by up to 2.4×
# on a day like 11-26 keeps every budget; short by 2.5× on a day like today would not.
SKETCH_FLOPS = 1.6e11 / 2.45
SKETCH_PRODUCTS = 0.5 * 2.45


def products_seconds(kind: str, calls: int, columns: int, *, D: int, modules: int, params: float,
                     step_flops: float, own: bool = False, rates: Rates = REFERENCE,
                     own_factor: float | None = None) -> float:
    """``calls`` batched JVPs (kind "jvp") or VJPs ("vjp") through a step with ``columns`` columns (rows)
    each, every sequence of the batch together: the fixed part per call (per chunk of rows for a VJP)
    plus the part per column. ``own``: the core derives these products by hand (:data:`OWN_FACTOR`, or
    ``own_factor``: the factor the core declares for its own, :func:`gradscope.models.core.own_cost`).
    ``rates``: the machine's (:class:`Rates`; per call: the module and column terms, per flop: the rest)."""
    c, d = rates.flop, rates.call
    if kind == "jvp":
        fixed, (flop, elem, col) = JVP_MODULE * modules * d + JVP_WEIGHT * params * c, JVP_COLUMN
        chunks = 1
    else:
        fixed, (flop, elem, col) = VJP_MODULE * modules * d + VJP_WEIGHT * params * c, VJP_COLUMN
        chunks = 1 if own else -(-columns * D // VJP_CHUNK)
    seconds = calls * (max(1, chunks) * fixed + columns * ((flop * step_flops + elem * D) * c + col * d))
    return seconds * (OWN_FACTOR[kind] if own_factor is None else own_factor) if own else seconds
