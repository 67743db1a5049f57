"""The machine's own rates for the plans: how the CPU that runs a command compares with
the one the cost constants were fitted on (:mod:`gradscope.analysis.cost`, :mod:`gradscope.workflows.dynamics_cost`).

A short calibration (~0.5 s) at first use times two probes with torch's current thread count:

* compute: float32 matrix products (8 × 256 × 256 × 256, BLAS-3: what the flops of every plan run at);
* calls: ``torch.func.jvp`` through a small step of a few elementwise ops and one product (what a small
  model's time is made of: Python and torch dispatch per call).

Each is divided by the same probe timed on the reference CPU (:data:`REFERENCE_SECONDS`: the 2-core AMD
EPYC with AVX-512 the constants were fitted on, idle, torch 2.13) and rounded to a quarter power of two,
with factors within ±19 % of 1 taken as 1 (the reference CPU plans what it always planned; timing noise
never flips a plan). The answer is cached by CPU model, torch version and thread count (``rates.json`` in
``$GRADSCOPE_RATES_DIR``, else ``~/.cache/gradscope``) when the machine was idle while it was measured,
so one idle machine plans the same work every time; a measurement taken while other processes were
runnable (:func:`gradscope.guard.runnable_others`) is used for that command only.

Every command times the probes again (~0.25 s): when other tasks want the cores (the run queue), ``load`` is
how much slower the probes run now than in the cached idle calibration, or the share of the cores the other
runnable threads leave by the scheduler's weights (:func:`gradscope.guard.queue_slowdown`: a 0.25 s probe
often runs at full speed beside two busy processes, because the scheduler favours a task that just woke, and
a long run then gets its fair share), whichever is larger, rounded the same way, at least 1;
on an idle run queue it is 1 (timing noise is not load). Background work at nice 19 that yields the cores
costs nothing, and counts as nothing.

``GRADSCOPE_RATES`` pins them: ``reference`` (the constants as they are; the test suite's setting),
``COMPUTE,CALLS[,LOAD]`` (numbers), or ``measure`` (measure again and cache).
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path

import torch

from gradscope.analysis.cost import REFERENCE, Rates
from gradscope.errors import GradscopeError
from gradscope.files.io import atomic_write_text
from gradscope.guard import queue_slowdown, runnable_others, usable_cores

# seconds of each probe (the best of its repeats) on the reference CPU, idle, by torch thread count;
# measured with `python -m gradscope.rates` (2026-11-28, AMD EPYC with AVX-512, torch 2.13.0+cpu)
REFERENCE_SECONDS = {1: {"compute": 0.0108, "calls": 0.0090},
                     2: {"compute": 0.0053, "calls": 0.0094}}
DEAD_ZONE = 0.25  # |log2 factor| below this: 1 (timing noise on the reference CPU)
STEP = 0.25  # factors are rounded to 2^(k · STEP)


def best_seconds(fn, repeats: int = 5) -> float:  # noqa: ANN001 - a probe
    """The shortest of ``repeats`` timings of ``fn`` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def probe_seconds() -> dict[str, float]:
    """The two probes' seconds with torch's current threads (seeded inputs; ~0.5 s in all)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(8, 256, 256, generator=gen)
    b = torch.randn(8, 256, 256, generator=gen)

    def compute() -> None:
        for _ in range(4):
            torch.bmm(a, b)

    w = torch.randn(64, 64, generator=gen) / 8
    x = torch.randn(8, 64, generator=gen)
    v = torch.randn(8, 64, generator=gen)

    def step(h: torch.Tensor) -> torch.Tensor:
        z = torch.sigmoid(h @ w)
        return z * h + (1 - z) * torch.tanh(h)

    def calls() -> None:
        with torch.no_grad():
            for _ in range(50):
                torch.func.jvp(step, (x,), (v,))

    return {"compute": best_seconds(compute), "calls": best_seconds(calls)}


def _reference(threads: int) -> dict[str, float]:
    """The reference CPU's probe seconds at ``threads`` (beyond 2: compute scaled as if linear in threads)."""
    if threads in REFERENCE_SECONDS:
        return REFERENCE_SECONDS[threads]
    top = max(REFERENCE_SECONDS)
    return {"compute": REFERENCE_SECONDS[top]["compute"] * top / threads, "calls": REFERENCE_SECONDS[top]["calls"]}


def rounded(factor: float) -> float:
    """``factor`` to the nearest quarter power of two, 1 within the dead zone, at least 1/16."""
    if not math.isfinite(factor) or factor <= 0:
        return 1.0
    exponent = math.log2(factor)
    if abs(exponent) < DEAD_ZONE:
        return 1.0
    return 2.0 ** max(-4.0, round(exponent / STEP) * STEP)


def cpu_model() -> str:
    """The CPU as /proc/cpuinfo names it, with its family, model and the vector width torch's kernels use (a
    virtual machine's "AMD EPYC" is Zen 3 with AVX2 or Zen 4 with AVX-512; ``ATEN_CPU_CAPABILITY=avx2`` runs
    AVX2 kernels on either), else what ``platform`` says."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    first = text.split("\n\n", 1)[0]
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines()) if v}
    flags = set(fields.get("flags", "").split())
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    # the kernels torch runs, which ATEN_CPU_CAPABILITY may hold below the CPU's own (an AVX2 plan on an AVX-512
    # CPU): rates measured at one width are not the other's
    vector = {"AVX512": vector, "AVX2": "AVX2" if vector != "no AVX2" else vector, "DEFAULT": "no AVX2"}.get(
        torch.backends.cpu.get_cpu_capability(), vector)
    name = fields.get("model name") or platform.processor() or platform.machine()
    return f"{name} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')}, {vector})"


def machine_key(threads: int) -> str:
    """The cache key: CPU model, torch version, thread count."""
    return f"{cpu_model()} | torch {torch.__version__} | {threads} thread(s)"


def cache_file() -> Path:
    """Where measured rates are kept."""
    folder = os.environ.get("GRADSCOPE_RATES_DIR")
    return (Path(folder) if folder else Path.home() / ".cache" / "gradscope") / "rates.json"


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # none yet, unreadable or not JSON: measure again (and replace it)


def pinned(text: str) -> Rates:
    """``GRADSCOPE_RATES``'s value as rates."""
    if text.strip().lower() == "reference":
        return REFERENCE
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not 2 <= len(values) <= 3 or not all(math.isfinite(v) and v > 0 for v in values):
        raise GradscopeError(f"GRADSCOPE_RATES: got {text!r}; give reference, measure, or COMPUTE,CALLS[,LOAD] "
                             f"(positive numbers)")
    return Rates(values[0], values[1], values[2] if len(values) == 3 else 1.0, "pinned")


_RECENT: dict[tuple[str, int], tuple[float, Rates]] = {}  # (GRADSCOPE_RATES, threads) → (when, rates)
REUSE_SECONDS = 30.0  # a process's plans within this long of a measurement reuse it


def current_rates() -> Rates:
    """:func:`machine_rates`, measured at most once per :data:`REUSE_SECONDS` in this process (a command's
    plans, one per checkpoint or per part of a study, all see the same rates)."""
    key = (os.environ.get("GRADSCOPE_RATES", ""), torch.get_num_threads())
    hit = _RECENT.get(key)
    if hit is not None and time.monotonic() - hit[0] < REUSE_SECONDS:
        return hit[1]
    rates = machine_rates()
    _RECENT[key] = (time.monotonic(), rates)
    return rates


def machine_rates(*, measure: bool | None = None, cache: Path | None = None) -> Rates:
    """This machine's rates now (see the module docstring): from ``GRADSCOPE_RATES`` when set; else the
    probes are timed now (~0.25 s) and compared with this CPU's cached idle calibration (made now when there
    is none, or when ``measure``): the cached factors, and ``load`` what the cores' sharing costs right now."""
    env = os.environ.get("GRADSCOPE_RATES", "").strip()
    if env and env.lower() != "measure":
        return pinned(env)
    measure = bool(measure) or env.lower() == "measure"
    threads = torch.get_num_threads()
    key = machine_key(threads)
    path = cache or cache_file()
    before = runnable_others()
    seconds = probe_seconds()
    after = runnable_others()
    reference = _reference(threads)
    now = {k: seconds[k] / reference[k] for k in seconds}  # unrounded factors of this moment
    entries = _read_cache(path)
    entry = entries.get(key)
    cached = isinstance(entry, dict) and all(isinstance(entry.get(k), (int, float)) and entry[k] > 0
                                             for k in ("compute", "calls", "raw_compute", "raw_calls"))
    # other tasks wanting the cores while the probes ran (unknown where the kernel does not say: taken as idle)
    busy = before is not None and after is not None and max(before, after) + threads > usable_cores()
    if cached and not measure:  # the load: how much slower than this machine idle, both probes together; only
        # when other tasks wanted the cores (a probe of an idle machine reads up to ~1.4× slow now and then)
        slower = math.sqrt(now["compute"] / entry["raw_compute"] * now["calls"] / entry["raw_calls"])
        # the probes alone may miss the load (the scheduler favours a task that just woke): the run queue's
        # share by weight (guard.queue_slowdown) is what a long run gets
        load = max(1.0, rounded(slower), rounded(queue_slowdown(threads) or 1.0)) if busy else 1.0
        return Rates(float(entry["compute"]), float(entry["calls"]), load, "measured, cached")
    compute, calls = rounded(now["compute"]), rounded(now["calls"])
    if busy:  # the measurement carries the load of this moment: use it once, never cache it
        return Rates(compute, calls, 1.0, "measured under load")
    entries[key] = {"compute": compute, "calls": calls, "raw_compute": now["compute"], "raw_calls": now["calls"],
                    "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(entries, indent=1, sort_keys=True))
    except (OSError, GradscopeError):
        pass  # a read-only home: measured again next time
    return Rates(compute, calls, 1.0, "measured")


if __name__ == "__main__":  # the probes' seconds here at torch's threads (REFERENCE_SECONDS; OMP_NUM_THREADS=1 for one)
    print(torch.get_num_threads(), {k: round(v, 6) for k, v in probe_seconds().items()})
