"""`gradscope dynamics`: where gradients vanish or explode (docs/definitions.md §7), over every checkpoint of a run.

Per checkpoint, on probe sequences (the base members of stability probes: L task tokens, then L
query tokens, one set of conditions as in ``gradscope stability``):
- **flow**: ‖∂y_T/∂z_k‖ (Frobenius, spectral) for every step k, from one reverse chain per sequence;
- **grid**: ‖∂z_T/∂z_t‖_F for all t ≤ T on the first ``grid_sequences`` sequences;
- **spectra**: spectral radius and top singular values of each step Jacobian J_t;
- **gates**: ‖term‖_F of each path through the cell (GRU carry/r/u/n; LSTM forget/i/g/o);
and, on ``trajectories`` long trajectories driven by the task's inputs,
- **lyapunov**: all D Lyapunov exponents (Benettin/QR), with the running estimate.

A long trajectory of a reverse-type task is its episodes back to back — L tokens drawn from the
task's vocabulary distribution, then L query tokens, positional encodings restarting with each
episode as in training — with the state carried across episodes (never reset), so the driven
system is the one the model saw, only longer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import xarray as xr
from torch import nn

from gradscope.workflows.options import DEVICE_LABEL
from gradscope.analysis import dynamics as dyn
from gradscope.analysis.lyapunov import analytic_jacobian, lyapunov_spectrum
from gradscope.config import RunConfig
from gradscope.errors import GradscopeError, check
from gradscope.guard import byte_text, check_bytes, check_ids, check_tensor, memory_budget
from gradscope.models.core import own_cost, own_products, weight_count
from gradscope.models.structure import JacobianStructure, structure_of
from gradscope.analysis import estimators as est
from gradscope.analysis.estimators import ITERATIONS, PROBES
from gradscope.analysis.tape import StateTape
from gradscope.analysis.held import held_blocks, held_names, recurrent_view
from gradscope.analysis.cost import OVERRUN, REFERENCE, PlanWarning, Rates
from gradscope.rates import current_rates
from gradscope.workflows.dynamics_cost import CoreShape, estimator_seconds, part_bytes, part_seconds
from gradscope.store.dynamics import DynamicsResult, dynamics_dataset
from gradscope.tasks.probes import Probes, frequency_groups, make_probes, read_counts_file
from gradscope.tasks.vocab import sample_tokens
from gradscope.tasks import make_task
from gradscope.tasks.registry import TASKS, probe_tasks
from gradscope.workflows.families.registry import check_probe_options, evaluation_of, text_families
from gradscope.files.checkpoint import Loaded
from gradscope.train.device import resolve_device
from gradscope.workflows.factory import build_model
from gradscope.models.wrap import WrappedModel, fit_positions
from gradscope.workflows.common import (conditions_for, config_attrs, expand_checkpoints, load_source,
                                        warn_diverged)
from gradscope.workflows.options import (FACTORY_LENGTH, LADDERS, PARTS, QR_DTYPE_NAMES, DynamicsOptions,
                                         applied_options, derived_warmup)  # declared there, torch-free

QR_DTYPES = dict(zip(QR_DTYPE_NAMES, (torch.float64, torch.float32)))
OWNERS = {"flow": ("sequences",), "grid": ("grid_sequences",), "spectra": ("sequences",), "gates": ("sequences",),
          "lyapunov": ("trajectories", "steps")}
FLAGS = {"sequences": "--sequences", "grid_sequences": "--grid-sequences", "trajectories": "--trajectories",
         "steps": "--steps"}
ESTIMATES = {"flow": f"‖∂y_T/∂z_k‖_F by Hutchinson ({PROBES} probes, standard error in flow_fro_se; the spectral norm "
                     f"is not estimated)",
             "grid": f"grid by Hutchinson ({PROBES} probes, standard error in tT_grid_se)",
             "spectra": f"top singular values by subspace iteration ({ITERATIONS} iterations, Ritz bound in step_sv_bound)",
             "gates": f"‖J_t‖_F by Hutchinson ({PROBES} probes, standard error in gate_norm_se)"}


def core_shape(core: nn.Module, width: int, rates: Rates = REFERENCE) -> CoreShape:
    """:class:`~gradscope.workflows.dynamics_cost.CoreShape` of a protocol core: a step's flops are two per
    parameter (its products) plus the state's elementwise work; priced at ``rates``."""
    params = weight_count(core)  # not a library backbone's token embedding: a step never multiplies by it
    return CoreShape(core.state_dim, core.out_dim, width, len(getattr(core, "gate_names", ("step",))),
                     structure_of(core), 2.0 * params + 20.0 * core.state_dim, analytic_jacobian(core),
                     sum(1 for _ in core.modules()), params, callable(getattr(core, "step_and_blocks", None)),
                     own_products(core), rates, tuple(sorted(own_cost(core).items())),
                     sum(b.width for b in held_blocks(core)), int(getattr(core, "positions", 0)))


@dataclass(frozen=True)
class DynamicsPlan:
    """What :func:`plan_dynamics` decided: every option (``options``, nothing left to choose), the
    number of Lyapunov exponents and their engine, each part's estimated seconds per checkpoint,
    and one line per decision (``lines``) for the user."""

    exponents: int  # k of the Lyapunov spectrum (D: all)
    engine: str  # structured, dense, partial or none
    note: str  # the Lyapunov line: what was chosen and why
    options: DynamicsOptions | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # per checkpoint, estimated
    checkpoints: int = 1
    lines: tuple[str, ...] = ()
    methods: dict[str, str] = field(default_factory=dict)  # part → exact or estimate (matrix-free, error bars)
    measured: dict[str, float] = field(default_factory=dict)  # part → seconds it took on the first checkpoint

    def describe(self) -> str:
        """The plan in a few lines, printed before any work."""
        return "\n".join(self.lines)


def _flow_method(structure: JacobianStructure, D: int, H: int) -> str:
    """:func:`gradscope.analysis.dynamics.gradient_flow`'s auto method, from the shape."""
    return "structured" if structure.is_diagonal else "jacobian" if D <= dyn.JACOBIAN_MAX_RATIO * H else "vjp"


def _secs(seconds: float) -> str:
    """Seconds for a message: whole seconds from 10 on, two significant digits below (never "~0 s")."""
    return f"{seconds:,.0f}" if seconds >= 10 else f"{seconds:.2g}"


def plan_dynamics(opts: DynamicsOptions, n: int, T: int, D: int, H: int, structure: JacobianStructure, gates: int,
                  steps: int | None = None, trajectories: int | None = None, *, conditions: int = 0,
                  shape: CoreShape | None = None, checkpoints: int = 1) -> DynamicsPlan:
    """The budget rule, before anything is allocated: the one estimate (:mod:`gradscope.workflows.dynamics_cost`)
    of every asked part's seconds and bytes, summed over ``checkpoints``, must fit ``opts.budget_seconds``
    and the machine's memory. Options left out (None) start at their largest and step down, the biggest
    part's first, until the estimate fits; a part left out of ``parts`` by default that still does not
    fit is dropped, and said so. A dense core's Lyapunov spectrum is all D exponents when they fit, else
    the top k that fit. Explicit options that do not fit are a one-line error naming the option.

    n: probe sequences (``conditions`` × sequences when ``conditions`` > 0, else fixed: the given
    tokens); steps/trajectories: fixed by given trajectory tokens. shape: the core's cost shape (default
    from D, H and structure: an analytic J_t and a small step)."""
    if steps is not None or trajectories is not None:
        opts = dataclasses.replace(opts, steps=steps or opts.steps, trajectories=trajectories or opts.trajectories,
                                   lyap_warmup=None if opts.lyap_warmup is None else min(opts.lyap_warmup, (steps or 10**9) - 1))
    shape = shape or CoreShape(D, H, D, gates, structure, 2.0 * 4 * D * max(D, H), True)
    budget, method = opts.budget_seconds, _flow_method(structure, D, H)
    auto_parts = opts.parts is None
    parts = list(PARTS if auto_parts else opts.parts)
    auto = {name for name in LADDERS if getattr(opts, name) is None and (name != "sequences" or conditions > 0)}
    values = {name: LADDERS[name][0] if name in auto else getattr(opts, name) for name in LADDERS}
    if "steps" in auto and opts.lyap_warmup is not None:  # an explicit warm-up needs longer trajectories
        ladder = [s for s in LADDERS["steps"] if s > opts.lyap_warmup] or [opts.lyap_warmup + 1]
    else:
        ladder = list(LADDERS["steps"])
    rungs = {**{k: list(v) for k, v in LADDERS.items()}, "steps": ladder}
    if "steps" in auto:
        values["steps"] = rungs["steps"][0]
    dense_k = structure.is_dense and opts.exponents is None
    check(opts.exponents is None or "lyapunov" not in parts or opts.exponents <= D,
          f"exponents: got {opts.exponents}; the model's state has D = {D} dimensions, so it has at most {D} "
          f"Lyapunov exponents (leave exponents out for all {D})")
    k = min(opts.exponents, D) if opts.exponents is not None else D
    lines, dropped = [], []

    def asked(part: str) -> bool:  # an option of the part given explicitly: the user wants that part
        return any(getattr(opts, x) is not None for x in OWNERS[part] if x != "sequences") or \
            (part == "lyapunov" and opts.exponents is not None)

    def estimate(at: dict[str, int] | None = None) -> dict[str, float]:
        v = values if at is None else at
        seq = v["sequences"] * conditions if conditions > 0 else n
        sizes = dict(n=seq, T=T, grid_sequences=v["grid_sequences"], sv=opts.sv)
        sec = part_seconds(shape, **sizes, trajectories=v["trajectories"], steps=v["steps"], exponents=k,
                           flow_method=method)
        sec.update({p: c for p, c in estimator_seconds(shape, **sizes, probes=PROBES, iterations=ITERATIONS).items()
                    if methods.get(p) == "estimate"})
        return {p: sec[p] for p in parts}

    # exact stays the default wherever it fits: a part switches to its matrix-free estimator (an error
    # bar stored beside each value) only when even its smallest exact run would take a quarter of the budget
    # (and only where the estimator is the cheaper of the two: at a tiny D exact is cheaper than any estimate)
    methods: dict[str, str] = {p: "exact" for p in parts}
    bottom = {x: rungs[x][-1] if x in auto else values[x] for x in LADDERS}
    smallest = estimate(bottom)
    for part in estimator_seconds(shape, n=1, T=T, grid_sequences=1, sv=opts.sv, probes=PROBES, iterations=ITERATIONS):
        if part in parts and smallest[part] * checkpoints > budget / 4:
            methods[part] = "estimate"
            if estimate(bottom)[part] >= smallest[part]:
                methods[part] = "exact"

    limit = memory_budget()

    def memory() -> tuple[float, dict[str, float]]:
        """(the plan's bytes as :func:`plan_bytes` counts them, each part's own share) at the current values."""
        seq = values["sequences"] * conditions if conditions > 0 else n
        work, kept = part_bytes(shape, n=seq, T=T, grid_sequences=values["grid_sequences"], sv=opts.sv,
                                trajectories=values["trajectories"], steps=values["steps"], exponents=k,
                                flow_method=method, methods=methods, probes=PROBES)
        return _total_bytes(work, kept, parts, checkpoints), {p: work[p] + 2 * checkpoints * kept[p] for p in parts}

    lyap_k = opts.exponents is None  # the exponents left to the plan: fewer may be kept (the top k) to fit memory
    while True:
        sec = estimate()
        total = sum(sec.values()) * checkpoints
        need, own = memory()
        if total <= budget and need <= limit:
            break
        by_memory = total <= budget  # the memory is what does not fit: shrink the part that holds the most
        progressed = False
        for part in sorted(sec, key=(own if by_memory else sec).get, reverse=True):
            knobs = [name for name in OWNERS[part] if name in auto and values[name] != rungs[name][-1]]
            if knobs:
                name = max(knobs, key=lambda x: values[x] / rungs[x][-1])
                values[name] = rungs[name][rungs[name].index(values[name]) + 1]
            elif part == "lyapunov" and (dense_k or (by_memory and lyap_k)) and k > 1:
                k = max(1, k // 2)
            elif auto_parts and len(parts) > 1 and not asked(part):
                parts.remove(part)
                dropped.append((part, sec[part] * checkpoints))
                values.update({x: rungs[x][0] for x in auto})  # what the dropped part forced down may grow back
                k = min(opts.exponents, D) if opts.exponents is not None else D
            else:
                continue
            progressed = True
            break
        if not progressed:
            worst = max(own if by_memory else sec, key=(own if by_memory else sec).get)
            hint = ", ".join(FLAGS[x] for x in OWNERS[worst]) + (", --exponents" if worst == "lyapunov" else "")
            if by_memory:
                raise GradscopeError(f"memory: the asked work would need {byte_text(need)} here ({worst} {byte_text(own[worst])}), "
                                     f"above the {byte_text(limit)} available to one allocation on this machine; leave "
                                     f"{worst} out with --parts, or ask for less ({hint})")
            raise GradscopeError(f"budget_seconds: the asked work would take ~{_secs(total)} s here "
                                 f"(estimated before any work at {shape.rates.describe()}; {worst} ~{_secs(sec[worst] * checkpoints)} s) over "
                                 f"{checkpoints} checkpoint(s), above the {budget:g} s budget; raise --budget-seconds, "
                                 f"leave {worst} out with --parts, or ask for less ({hint})")
    if lyap_k and "lyapunov" in parts and k < D:  # the largest k that fits: bisect between k and 2k
        low, high = k, min(2 * k, D + 1)
        while high - low > 1:
            mid = (low + high) // 2
            k = mid
            trial = sum(estimate().values()) * checkpoints
            low, high = (mid, high) if trial <= budget and memory()[0] <= limit else (low, mid)
        k = low
        sec = estimate()
    chosen = dataclasses.replace(opts, parts=tuple(parts), **values,
                                 lyap_warmup=opts.lyap_warmup if opts.lyap_warmup is not None else derived_warmup(values["steps"]))
    changed = [f"{FLAGS[x]} {LADDERS[x][0]} → {values[x]}" for x in LADDERS if x in auto and values[x] != LADDERS[x][0]]
    if changed:
        lines.append(f"plan: {', '.join(changed)} to fit the {budget:g} s budget (give them, or --budget-seconds)")
    for part, s in dropped:
        lines.append(f"plan: {part} left out: ~{s:,.0f} s at its smallest (ask for it with --parts and raise --budget-seconds)")
    engine, note = "none", ""
    if "lyapunov" in parts:
        if not structure.is_dense:
            engine = "structured"
            held = sum(b.width for b in structure.blocks if b.held)
            what = f"all {D - held} exponents of the recurrent blocks (the caches held)" if held else f"all {D} exponents"
            note = (f"lyapunov: {what} exactly from the declared structure ({structure.describe()})"
                    if k == D else f"lyapunov: the top {k} of {D} exponents from the declared structure"
                    + ("" if opts.exponents is not None else f" (all {D}, with their history for the error bars, "
                                                              f"would not fit the memory; --exponents changes it)"))
        elif k == D:
            engine, note = "dense", f"lyapunov: all {D} exponents (dense Benettin/QR)"
        elif opts.exponents is not None:
            engine, note = "partial", f"lyapunov: the top {k} of {D} exponents"
        else:
            engine = "partial"
            note = (f"lyapunov: the top {k} of {D} exponents (all {D} would not fit the {budget:g} s budget; "
                    f"--exponents or --budget-seconds change it)")
    total = sum(sec.values()) * checkpoints
    estimated = [p for p in parts if methods.get(p) == "estimate"]
    lines.append("plan: " + ", ".join(f"{p} ~{sec[p] * checkpoints:,.1f} s" for p in parts)
                 + f" (total ~{total:,.0f} s for {checkpoints} checkpoint(s), estimated at "
                   f"{shape.rates.describe()}; budget {budget:g} s)")
    if estimated:
        lines.append(f"plan: {', '.join(estimated)} estimated matrix-free (J_t never formed; exact would take "
                     f"~{sum(smallest[p] for p in estimated) * checkpoints:,.0f} s at the smallest sizes): "
                     + "; ".join(ESTIMATES[p] for p in estimated) + "; every other value exact")
    else:
        lines.append("plan: every value exact")
    if note:
        lines.append(note)
    return DynamicsPlan(k if "lyapunov" in parts else D, engine, note, chosen, sec, checkpoints, tuple(lines),
                        {p: methods[p] for p in parts})


def plan_core(core: nn.Module, opts: DynamicsOptions, n: int, T: int, *, width: int | None = None,
              conditions: int = 0, checkpoints: int = 1, steps: int | None = None,
              trajectories: int | None = None, rates: Rates | None = None) -> DynamicsPlan:
    """:func:`plan_dynamics` for a protocol core, at ``rates`` (None: this machine's now,
    :func:`gradscope.rates.current_rates`)."""
    shape = core_shape(core, width if width is not None else core.state_dim,
                       current_rates() if rates is None else rates)
    return plan_dynamics(opts, n, T, core.state_dim, core.out_dim, shape.structure, shape.gates, steps, trajectories,
                         conditions=conditions, shape=shape, checkpoints=checkpoints)


def plan_bytes(plan: DynamicsPlan, n: int, T: int, shape: CoreShape) -> int:
    """The plan's memory: its largest working set plus every checkpoint's kept results (twice: held,
    then copied once into the store)."""
    o = plan.options
    work, kept = part_bytes(shape, n=n, T=T, grid_sequences=o.grid_sequences, sv=o.sv, trajectories=o.trajectories,
                            steps=o.steps, exponents=plan.exponents,
                            flow_method=_flow_method(shape.structure, shape.D, shape.H), methods=plan.methods,
                            probes=PROBES)
    return _total_bytes(work, kept, o.parts, plan.checkpoints)


def _total_bytes(work: dict[str, int], kept: dict[str, int], parts: Sequence[str], checkpoints: int) -> int:
    """The largest working set of ``parts`` plus every checkpoint's kept results, twice (held, then copied
    once into the store)."""
    return max(work[p] for p in parts) + 2 * checkpoints * sum(kept[p] for p in parts)


def check_plan_bytes(plan: DynamicsPlan, n: int, T: int, shape: CoreShape, what: str) -> None:
    """Refuse the plan if its memory (:func:`plan_bytes`) exceeds what the machine has."""
    check_bytes(plan_bytes(plan, n, T, shape), what)


TRUSTED = 0.1  # the watch goes by the measured pace once the parts so far took this share of the budget


@dataclass
class PartWatch:
    """The run-time half of the budget rule, for the first checkpoint's parts (:func:`analyse_model`'s
    ``gate``): before each part, the parts so far give measured ÷ estimated seconds (``ratio``, once they
    took :data:`TRUSTED` of the budget; before, the plan's own pace, 1); if the rest
    of the plan at that ratio (this part on, and every part of the later checkpoints) would end past
    :data:`OVERRUN` × the budget, the part is left out (for every checkpoint, so the store stays whole) with
    a :class:`PlanWarning`, when the plan chose the parts (``may_drop``: no --parts given). The first part
    always runs: it is the measurement."""

    plan: DynamicsPlan
    may_drop: bool
    start: float = field(default_factory=lambda: time.perf_counter())
    done: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    ratio: float = 1.0
    lines: list[str] = field(default_factory=list)
    measured: dict[str, float] = field(default_factory=dict)  # part → its seconds (the parts that ran)
    last: float = 0.0  # elapsed at the previous call

    def __call__(self, part: str) -> bool:
        elapsed = time.perf_counter() - self.start
        if self.done and self.done[-1] not in self.measured:
            self.measured[self.done[-1]] = elapsed - self.last
        self.last = elapsed
        estimated = sum(self.plan.seconds.get(p, 0.0) for p in self.done)
        budget = self.plan.options.budget_seconds if self.plan.options is not None else math.inf
        # the pace so far, once it is worth trusting: a small part may miss its own estimate by 2× while the
        # plan as a whole errs long (gradscope's Mamba sample: the flow 2.3× its estimate, the run 5× shorter)
        if estimated > 0 and elapsed >= TRUSTED * budget:
            self.ratio = elapsed / estimated
        if not part:
            return True
        est = self.plan.seconds
        kept = [p for p in (self.plan.options.parts if self.plan.options is not None else ()) if p not in self.dropped]

        def projected(parts: list[str]) -> float:  # the end, at the ratio so far, running ``parts`` from now
            ahead = [p for p in parts if p not in self.done]
            return elapsed + self.ratio * (sum(est.get(p, 0.0) for p in ahead)
                                           + (self.plan.checkpoints - 1) * sum(est.get(p, 0.0) for p in parts))

        if self.done and self.may_drop and projected(kept) > OVERRUN * budget:
            # leave out the biggest parts still ahead until the rest fits; this one only if it is among them
            ahead = sorted((p for p in kept if p not in self.done), key=lambda p: est.get(p, 0.0), reverse=True)
            left = list(kept)
            for p in ahead:
                if projected(left) <= OVERRUN * budget:
                    break
                left.remove(p)
            if part not in left:
                self.dropped.append(part)
                line = (f"plan: {part} left out while running: the parts so far took {self.ratio:.2g}× their "
                        f"estimate here, so the plan would end ~{_secs(projected(kept))} s into the {budget:g} s "
                        f"budget (ask for it with --parts, or raise --budget-seconds)")
                self.lines.append(line)
                warnings.warn(line, PlanWarning, stacklevel=2)
                return False
        self.done.append(part)
        return True

    def applied(self, plan: DynamicsPlan) -> DynamicsPlan:
        """``plan`` with each part's measured seconds, without the parts left out (its lines saying so)."""
        if not self.dropped or plan.options is None:
            return dataclasses.replace(plan, measured=dict(self.measured))
        parts = tuple(p for p in plan.options.parts if p not in self.dropped)
        return dataclasses.replace(plan, options=dataclasses.replace(plan.options, parts=parts),
                                   seconds={p: v for p, v in plan.seconds.items() if p in parts},
                                   measured=dict(self.measured),
                                   lines=plan.lines + tuple(self.lines),
                                   engine=plan.engine if "lyapunov" in parts else "none")


LYAPUNOV_ERRORS = ("lyapunov_se_batch", "lyapunov_se_trajectories", "lyapunov_drift", "lyapunov_running_se")


def nonfinite_counts(parts: dict[str, np.ndarray]) -> dict[str, int]:
    """NaN/Inf values per stored part that a healthy model gives finite (a diverged model's): the
    (t, T) grid's undefined t > T half and the flow's column T (it needs a readout) are skipped."""
    counts = {}
    for name, values in parts.items():
        if name in LYAPUNOV_ERRORS:  # NaN by definition where an exponent is −inf or one trajectory has no spread
            continue
        if name.startswith("lyapunov"):  # −inf is an exact exponent, not a sign of divergence
            counts[name] = int(np.isnan(values).sum() + np.isposinf(values).sum())
            continue
        if name in ("grid", "grid_se"):
            values = values[..., np.triu(np.ones(values.shape[-2:], dtype=bool))]
        elif name.startswith("flow_"):
            values = values[..., :-1]
        counts[name] = int(values.size - np.isfinite(values).sum())
    return counts


@dataclass(frozen=True)
class DynamicsRun:
    """A finished dynamics analysis; :meth:`to_xarray` gives the dynamics store's dataset."""

    config: dict[str, Any]
    probes: Probes
    token_class: np.ndarray  # (n, T) frequent / rare / query
    results: list[DynamicsResult]
    gate_names: tuple[str, ...]
    lyapunov_steps: np.ndarray | None
    options: DynamicsOptions
    command: str = ""
    device: str = DEVICE_LABEL
    nonfinite: dict[str, int] = field(default_factory=dict)  # part → NaN/Inf values (see nonfinite_counts)
    plan: DynamicsPlan | None = None  # how many Lyapunov exponents, by which engine, and why
    held: str = ""  # the attention caches the step spectra, gates and Lyapunov spectrum hold as inputs (analysis.held)

    def to_xarray(self) -> xr.Dataset:
        tokens = self.probes.tokens[:, 0].numpy()  # the base members
        n, L = tokens.shape
        query = np.full((n, self.token_class.shape[1] - L), -1)  # the output phase's query token
        ds = dynamics_dataset(self.results, tokens=np.concatenate([tokens, query], axis=1),
                              token_class=self.token_class, condition=np.asarray(self.probes.conditions),
                              gate_names=self.gate_names, lyapunov_steps=self.lyapunov_steps,
                              options=applied_options(self.options), config=self.config,
                              command=self.command, device=self.device)
        ds.attrs["nonfinite_values"] = json.dumps(self.nonfinite)
        if self.held:
            ds.attrs["held"] = self.held
        if self.plan is not None:
            ds.attrs["lyapunov_plan"] = json.dumps({"exponents": self.plan.exponents, "engine": self.plan.engine,
                                                    "note": self.plan.note})
            ds.attrs["plan"] = self.plan.describe()
            ds.attrs["part_seconds"] = json.dumps({p: {"estimated": round(self.plan.seconds.get(p, 0.0), 3),
                                                       "measured": round(self.plan.measured[p], 3)}
                                                   for p in self.plan.measured})  # the first checkpoint's
        return ds


def warn_diverged_values(run: DynamicsRun) -> None:
    """:func:`~gradscope.workflows.common.warn_diverged` when some values a healthy model gives finite
    are NaN or Inf."""
    bad = {k: v for k, v in run.nonfinite.items() if v}
    if bad:
        warn_diverged(", ".join(f"{v} in {k}" for k, v in bad.items()), "they are stored as they are")


def task_trajectories(model: nn.Module, config: RunConfig, steps: int, n: int, seed: int,
                      vocab: int | None = None) -> torch.Tensor:
    """Inputs (n, steps, in) of long trajectories: the task's episodes back to back (module docstring).
    ``vocab``: the ids the model reads (the family's ``probe_ids``); when not the task's K (a vector
    task's probe table) they are drawn uniformly."""
    task, L = config.task, config.task.length
    episodes = math.ceil(steps / (2 * L))
    gen = torch.Generator().manual_seed(seed)
    distribution = task.distribution if vocab in (None, task.vocab_size) else "uniform"
    tokens = sample_tokens((n * episodes, L), vocab or task.vocab_size, distribution, task.rarity, gen)
    tokens = torch.cat([tokens, torch.full_like(tokens, model.query_token)], dim=1)  # (n·E, 2L)
    with torch.no_grad():
        x = model.core_inputs(tokens.to(next(model.parameters()).device))  # (n·E, 2L, in)
    return x.reshape(n, episodes * 2 * L, -1)[:, :steps]


def analyse_model(model: nn.Module, probes_inputs: torch.Tensor, trajectories: torch.Tensor | None,
                  opts: DynamicsOptions, exponents: int | None = None,
                  methods: dict[str, str] | None = None,
                  gate: Callable[[str], bool] | None = None) -> tuple[dict[str, np.ndarray],
                                                                              dict[str, tuple[float, float]],
                                                                              tuple[str, ...], np.ndarray | None]:
    """Every requested part for one model. probes_inputs: token ids (n, T); trajectories: inputs (m, S, in);
    exponents: the top k Lyapunov exponents (None: all). methods: part → "estimate" for the matrix-free
    estimators (:mod:`gradscope.analysis.estimators`, seeded ``opts.seed + 2``), else exact. ``gate(part)``
    before each part (and ``gate("")`` after the last): False leaves that part out (:class:`PartWatch`)."""
    methods = methods or {}
    run: dict[str, bool] = {}  # filled in order, as each part starts

    def wanted(part: str) -> bool:
        run[part] = part in opts.parts and (gate is None or gate(part))
        return run[part]

    gen = torch.Generator().manual_seed(opts.seed + 2)
    parts: dict[str, np.ndarray] = {}
    cpu = lambda v: v.detach().to("cpu", torch.float64).numpy()  # noqa: E731
    core = model.core
    names: tuple[str, ...] = ()
    lyap_steps = None
    with torch.no_grad():
        if any(methods.get(p) == "estimate" for p in opts.parts):
            x = model.core_inputs(probes_inputs)
            prev = StateTape(core, x)  # never T × D for long runs: segments recomputed from checkpoints
        # the step spectra, gates and Lyapunov spectrum: the recurrent blocks', attention caches held (analysis.held)
        rcore, rmodel, rtokens = core, model, probes_inputs
        if held_blocks(core) and any(p in opts.parts for p in ("spectra", "gates")):
            rcore, rtokens = recurrent_view(core, model.core_inputs(probes_inputs))
            rmodel = WrappedModel(rcore, None, None, getattr(model, "source", ""))
            if any(methods.get(p) == "estimate" for p in ("spectra", "gates")):
                rx, rprev = rtokens, StateTape(rcore, rtokens)
        elif any(methods.get(p) == "estimate" for p in opts.parts):
            rx, rprev = x, prev
        if wanted("flow") and methods.get("flow") == "estimate":
            fro, se = est.flow_hutchinson(core, x, prev, generator=gen)
            parts["flow_fro"], parts["flow_fro_se"] = cpu(fro), cpu(se)
        elif run["flow"]:
            fro, spectral = dyn.gradient_flow(model, probes_inputs)
            parts["flow_fro"], parts["flow_spectral"] = cpu(fro), cpu(spectral)
        if wanted("grid") and methods.get("grid") == "estimate":
            g = opts.grid_sequences
            grid, se = est.grid_hutchinson(core, x[:g], StateTape(core, x[:g]), generator=gen)
            parts["grid"], parts["grid_se"] = cpu(grid), cpu(se)
        elif run["grid"]:
            grid = dyn.tT_grid(model, probes_inputs[:opts.grid_sequences])
            parts["grid"] = cpu(grid)
        if wanted("spectra") and methods.get("spectra") == "estimate":
            k = min(opts.sv, rcore.state_dim)
            parts["radius"] = cpu(dyn.block_radius(rcore, rx, rprev))
            values, bound = est.step_top_singular(rcore, rx, rprev, k, generator=gen)
            parts["singular"], parts["singular_bound"] = cpu(values), cpu(bound)
        elif run["spectra"]:
            spectra = dyn.step_spectra(rmodel, rtokens, top_k=min(opts.sv, rcore.state_dim))
            parts["radius"] = cpu(spectra["radius"])
            parts["singular"] = cpu(spectra["singular_values"][..., :opts.sv])
        if wanted("gates") and methods.get("gates") == "estimate":
            names = tuple(getattr(rcore, "gate_names", ("step",)))
            fro, se = est.step_fro_hutchinson(rcore, rx, rprev, generator=gen)
            parts["gates"], parts["gates_se"] = cpu(fro[..., None]), cpu(se[..., None])
        elif run["gates"]:
            names, norms = dyn.gate_norms(rcore, rmodel.core_inputs(rtokens))
            parts["gates"] = cpu(norms)
        if wanted("lyapunov") and trajectories is not None:
            lcore, ltraj = core, trajectories
            if held_blocks(core):  # the caches of the whole trajectory, held as its inputs
                if getattr(core, "positions", trajectories.shape[1]) < trajectories.shape[1]:
                    lcore = core.with_positions(trajectories.shape[1])
                lcore, ltraj = recurrent_view(lcore, trajectories)
                exponents = None if exponents is None else min(exponents, lcore.state_dim)
            res = lyapunov_spectrum(lcore, ltraj, warmup=opts.lyap_warmup, reorth=opts.reorth,
                                        exponents=exponents, qr_dtype=QR_DTYPES[opts.qr_dtype])
            parts["lyapunov"] = cpu(res.exponents)
            parts["lyapunov_below_resolution"] = res.below_resolution.to("cpu", torch.int64).numpy()
            parts["lyapunov_running"] = cpu(res.running.mean(0))
            parts["lyapunov_se_batch"] = cpu(res.se_batch)  # error bars (analysis.lyapunov's docstring)
            parts["lyapunov_se_trajectories"] = cpu(res.se_trajectories())
            parts["lyapunov_drift"] = cpu(res.drift)
            parts["lyapunov_unconverged"] = res.unconverged.to("cpu", torch.int64).numpy()
            parts["lyapunov_running_se"] = cpu(res.running_se())
            lyap_steps = np.asarray(res.running_steps)
        if gate is not None:
            gate("")
    return parts, dyn.block_spectra(core), names, lyap_steps


def run_checkpoint_dynamics(paths: list[Path | Loaded], opts: DynamicsOptions = DynamicsOptions(), *,
                            on_start: Callable[[int], None] | None = None,
                            on_progress: Callable[[int], None] | None = None,
                            command: str = "", on_plan: Callable[[DynamicsPlan], None] | None = None) -> DynamicsRun:
    """Dynamics of every checkpoint (run directories expand to all of theirs, oldest first), on the
    same probe sequences (``opts.target_freq`` × ``opts.disturbant``; the test paragraphs of a checkpoint probed on
    its corpus, moved where its family's own option says) and the same trajectories. ``on_progress(1)`` after each checkpoint.
    Checkpoints are loaded one at a time, each dropped before the next is loaded; a diverged one
    (NaN/Inf values) is stored as it is, with a :class:`DivergedWarning`. ``on_plan(plan)`` before any
    work: what :func:`plan_dynamics` chose for options left out, and why."""
    files = expand_checkpoints(paths)
    device = resolve_device(opts.device)
    loaded = load_source(files[0])
    first = loaded.path
    task, core_name = loaded.config.task, loaded.config.model.core
    source = evaluation_of(TASKS[task.name]).text_probes  # the family's own text: its test paragraphs
    text = source is not None  # no output phase
    check(text or task.name in probe_tasks(), f"checkpoint: its task is {task.name!r}; dynamics probes are defined "
                                              f"for {', '.join(probe_tasks())} (an input phase followed by query "
                                              f"tokens) and {' and '.join(text_families())}")
    check_probe_options(loaded, opts)  # another family's own probe options: refused, not ignored
    target_freq, disturbant = opts.target_freq, opts.disturbant
    check(not text or not (target_freq or disturbant),
          f"target_freq/disturbant: {task.name} checkpoints are probed on test paragraphs; each step is classed "
          f"frequent or rare by the corpus's train counts")
    conditions = [(source.label, source.label)] if text else conditions_for(task, target_freq, disturbant)
    # the model as the family's probes see it (a vector task: ids into a seeded table of sphere points)
    family = make_task(task)
    as_probed = lambda m: family.probed(m, opts.seed)  # noqa: E731
    probed = as_probed(loaded.model)
    vocab = family.probe_ids
    core, query = probed.core, probed.query_token
    width = probed.core_inputs(torch.zeros(1, 1, dtype=torch.long)).shape[-1]
    T = (1 if text else 2) * task.length
    auto_parts = opts.parts is None
    plan = plan_core(core, opts, len(conditions) * (opts.sequences or 0), T, width=width, conditions=len(conditions),
                     checkpoints=len(files))
    opts = plan.options
    n = len(conditions) * opts.sequences
    check_plan_bytes(plan, n, T, core_shape(core, width), "sequences/grid_sequences/trajectories/steps/exponents")
    if on_plan is not None:
        on_plan(plan)
    if source is not None:
        own = source.task(loaded, opts)
        tokens = source.sequences(own, opts.sequences, opts.seed)
        probes = Probes(tokens[:, None].expand(-1, 3, -1).clone(), (source.label,) * n, (source.label,) * n)
        classes = source.token_classes(tokens, own)
    else:
        probes = make_probes(opts.sequences, task.length, 1, vocab, conditions, opts.seed)
        tokens = torch.cat([probes.tokens[:, 0], torch.full_like(probes.tokens[:, 0], query)], dim=1)
        classes = family.probe_classes(tokens, query)
    config = config_attrs(loaded.config)
    if on_start is not None:
        on_start(len(files))
    results, names, lyap_steps, nonfinite = [], (), None, {}
    for i, item in enumerate(files):
        if i:
            loaded = load_source(item)
        path = loaded.path
        check(loaded.config.task == task and loaded.config.model.core == core_name,
              f"checkpoint: {path} has another task or core than {first}; analyse it separately")
        model = as_probed(loaded.model.to(device))
        traj = None if "lyapunov" not in opts.parts else \
            source.trajectories(model, own, opts.steps, opts.trajectories, opts.seed + 1) if source is not None else \
            task_trajectories(model, loaded.config, opts.steps, opts.trajectories, opts.seed + 1, vocab)
        watch = PartWatch(plan, may_drop=auto_parts) if i == 0 else None
        parts, blocks, names, lyap_steps = analyse_model(model, tokens.to(device), traj, opts, plan.exponents,
                                                         plan.methods, gate=watch)
        if watch is not None:  # what was left out is left out of every later checkpoint too
            plan = watch.applied(plan)
            opts = plan.options
        run = path.parent.name if path.parent != Path("") else ""
        results.append(DynamicsResult(path, loaded.iteration, run, parts, blocks))
        for k, v in nonfinite_counts(parts).items():
            nonfinite[k] = nonfinite.get(k, 0) + v
        loaded = model = traj = None  # only one checkpoint in memory at a time
        if on_progress is not None:
            on_progress(1)
    out = DynamicsRun(config, probes, classes, results, names, lyap_steps, opts, command, str(device), nonfinite, plan)
    warn_diverged_values(out)
    return out


STEP_PARTS = ("spectra", "gates", "lyapunov")  # defined on a recurrent state's own step map (docs/definitions.md §7, §8)


def defined_parts(core: nn.Module, opts: DynamicsOptions) -> DynamicsOptions:
    """``opts`` for a core whose state is all attention caches (a pure transformer): the step spectra, gates and
    Lyapunov spectrum are not defined there (no recurrent state; the caches grow with the position), so they
    are refused in one line when asked for and left out of the default parts; any other core's ``opts`` as given."""
    blocks = structure_of(core).blocks
    if not blocks or not all(b.held for b in blocks):
        return opts
    asked = [p for p in (opts.parts or ()) if p in STEP_PARTS]
    family = getattr(core, "family", type(core).__name__)
    check(not asked, f"parts: {', '.join(asked)} not defined for a {family} transformer: its state is its attention "
                     f"caches, which grow with the position, and it has no recurrent state of its own; the flow "
                     f"and grid are defined")
    return opts if opts.parts is not None else dataclasses.replace(opts, parts=tuple(p for p in PARTS if p not in STEP_PARTS))


def run_model_dynamics(model: nn.Module, tokens: torch.Tensor, opts: DynamicsOptions = DynamicsOptions(), *,
                       trajectory_tokens: torch.Tensor | None = None, counts: torch.Tensor | None = None,
                       command: str = "", on_plan: Callable[[DynamicsPlan], None] | None = None) -> DynamicsRun:
    """Dynamics of one in-memory model (``gradscope.wrap(...)`` or a loaded gradscope model).

    tokens: the probe sequences (n, T) token ids. trajectory_tokens: the Lyapunov trajectories' token
    ids (m, S) — by default ``opts.trajectories`` × ``opts.steps`` tokens drawn uniformly from the
    embedding's vocabulary (a wrapped model with an ``nn.Embedding``), else required.
    counts: token counts per id (optional): steps are then classed frequent/rare by
    :func:`~gradscope.tasks.probes.frequency_groups`, else every step is class ``token``."""
    check(isinstance(model, nn.Module) and hasattr(model, "core") and hasattr(model, "core_inputs"),
          f"model: expected a gradscope model or gradscope.wrap(...); got {type(model).__name__}")
    vocab = getattr(getattr(model, "inputs", None), "num_embeddings", None)
    for name, ids in (("tokens", tokens), ("trajectory_tokens", trajectory_tokens)):
        if ids is not None or name == "tokens":
            check_tensor(ids, name, kind="int", ndim=2)
            check(ids.shape[0] >= 1 and ids.shape[1] >= 1, f"{name}: shape {tuple(ids.shape)}; expected (n >= 1, T >= 1)")
            if vocab is not None:
                check_ids(ids, name, int(vocab))
    model = fit_positions(model, tokens.shape[1])  # attention caches: the probes' slots (Lyapunov sizes its own)
    width = model.core_inputs(tokens[:1, :1].to(next(model.parameters()).device)).shape[-1]
    core = model.core
    chosen = opts.parts is None  # the plan may leave out parts it chose, never ones the caller asked for
    opts = defined_parts(core, opts)
    n, T = tokens.shape
    fixed = {} if trajectory_tokens is None else {"steps": trajectory_tokens.shape[1],
                                                  "trajectories": trajectory_tokens.shape[0]}
    plan = plan_core(core, dataclasses.replace(opts, sequences=opts.sequences or n), n, T, width=width, **fixed)
    lyap = plan.options
    check_plan_bytes(plan, n, T, core_shape(core, width), "tokens/trajectories/steps/exponents")
    if on_plan is not None:
        on_plan(plan)
    device = resolve_device(opts.device)
    model = model.to(device)
    if "lyapunov" in lyap.parts and trajectory_tokens is None:
        check(vocab is not None, "trajectory_tokens: give the Lyapunov trajectories' token ids (m, S) for this model")
        gen = torch.Generator().manual_seed(opts.seed + 1)
        trajectory_tokens = torch.randint(0, int(vocab), (lyap.trajectories, lyap.steps), generator=gen)
    traj = None
    if trajectory_tokens is not None:
        with torch.no_grad():
            traj = model.core_inputs(trajectory_tokens.to(device))
    classes = np.full(tuple(tokens.shape), "token", dtype=object)
    if counts is not None:
        groups = frequency_groups(torch.as_tensor(counts))
        for name in ("frequent", "rare"):
            classes[np.isin(tokens.numpy(), groups[name].numpy())] = name
    watch = PartWatch(plan, may_drop=chosen)
    parts, blocks, names, lyap_steps = analyse_model(model, tokens.to(device), traj, lyap, plan.exponents,
                                                     plan.methods, gate=watch)
    plan = watch.applied(plan)
    lyap = plan.options
    probes = Probes(tokens[:, None].expand(-1, 3, -1).clone(), ("given",) * len(tokens), ("given",) * len(tokens))
    own = getattr(model, "config", None)
    config = {"model_config": dataclasses.asdict(own) if dataclasses.is_dataclass(own) else
              (model.describe() if hasattr(model, "describe") else {"core": type(model.core).__name__}),
              "task_config": {}, "train_config": {}}
    result = DynamicsResult(Path("<in memory>"), -1, "", parts, blocks)
    out = DynamicsRun(config, probes, classes, [result], names, lyap_steps, lyap, command, str(device),
                      nonfinite_counts(parts), plan, held_names(core))
    warn_diverged_values(out)
    return out


def run_factory_dynamics(spec: str, checkpoint: Path, opts: DynamicsOptions = DynamicsOptions(), *,
                         command: str = "", config: Path | None = None,
                         on_plan: Callable[[DynamicsPlan], None] | None = None) -> DynamicsRun:
    """``gradscope dynamics --model-factory FILE.py:FUNC CKPT`` (or ``hf[:CLASS]``, with ``config``: see
    :func:`gradscope.workflows.factory.build_model`): the model that ``FUNC(CKPT)`` builds, on
    ``opts.sequences`` probe sequences of ``opts.length`` tokens (None: :data:`FACTORY_LENGTH`) drawn uniformly
    (seed ``opts.seed``) from its embedding's vocabulary; steps classed frequent/rare by ``opts.token_counts``
    when given."""
    length = FACTORY_LENGTH if opts.length is None else opts.length
    token_counts = opts.token_counts
    model = build_model(spec, Path(checkpoint), config)
    vocab = getattr(getattr(model, "inputs", None), "num_embeddings", None)
    check(vocab is not None, f"model_factory: {spec} built a model without an nn.Embedding input; dynamics draws its "
                             f"probe tokens from the embedding's vocabulary (use gradscope.dynamics(model, tokens=…) "
                             f"in Python for float inputs)")
    model = fit_positions(model, length)
    if opts.sequences is None:  # the plan chooses how many probe sequences fit, as for a checkpoint
        width = model.core_inputs(torch.zeros(1, 1, dtype=torch.long)).shape[-1]
        opts = dataclasses.replace(opts, sequences=plan_core(model.core, defined_parts(model.core, opts), 0, length,
                                                             width=width, conditions=1).options.sequences)
    gen = torch.Generator().manual_seed(opts.seed)
    tokens = torch.randint(0, int(vocab), (opts.sequences, length), generator=gen)
    counts = read_counts_file(token_counts) if token_counts is not None else None
    run = run_model_dynamics(model, tokens, opts, counts=counts, command=command, on_plan=on_plan)
    result = dataclasses.replace(run.results[0], path=Path(checkpoint), run=Path(checkpoint).stem)
    return dataclasses.replace(run, results=[result])
