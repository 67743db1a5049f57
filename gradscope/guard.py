"""The validation layer's shared checks, used at every boundary where outside data comes in.

- **Sizes:** :func:`check_bytes` compares what a file or an option implies against the memory this
  machine has available (and, given the bytes actually present, against a plausible compression
  ratio), *before* anything is allocated.
- **Values:** :func:`as_int` takes an integer from a file or an option (no bool, str, NaN, 1e30);
  :func:`check_tensor` accepts only a dense, strided, CPU tensor whose storage really holds its
  elements (no sparse, meta or stride-0 bomb).
- **Paths:** :func:`safe_component` and :func:`inside` keep a path built from a spec, a store or a
  manifest inside its root.
- **Weights:** :func:`nonfinite_tensors` names a model's parameters and buffers that hold NaN or Inf;
  :func:`warn_nonfinite` says so in a :class:`NonFiniteWeightsWarning` (every path that loads or wraps
  a model calls it, before any work).
- **Threads:** :func:`use_free_cores` sets torch's threads to the cores no other runnable process wants
  (the console script calls it for the analysis commands).

Temporaries, publication and every other write to disk live in :mod:`gradscope.files`.
"""

from __future__ import annotations

import math
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from gradscope.errors import GradscopeError, GradscopeWarning

MEMORY_FRACTION = 0.5  # of the memory available now: the most one allocation may claim
MAX_RATIO = 1000.0  # declared bytes per byte present above which a large input is a decompression bomb
SMALL = 64 << 20  # inputs below this size are never refused for their compression ratio
GiB = 1 << 30


def available_memory() -> int:
    """Bytes of memory available now (``MemAvailable``; the physical total where that is unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * GiB


def memory_budget() -> int:
    """The most bytes one input or option may make gradscope allocate (``GRADSCOPE_MEMORY_BUDGET``
    in bytes overrides it, e.g. for a machine shared with other jobs)."""
    env = os.environ.get("GRADSCOPE_MEMORY_BUDGET", "")
    if env.strip().isdigit():
        return int(env)
    return int(available_memory() * MEMORY_FRACTION)


def byte_text(nbytes: float) -> str:
    """A byte count for a message: 1.2 GB, 340.0 MB, 12.0 kB, 512 B."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def check_bytes(nbytes: float, what: str, *, present: float | None = None) -> None:
    """Refuse ``what`` if it would need ``nbytes`` of memory beyond the budget, or (given the bytes
    actually ``present`` in the file) if it expands more than :data:`MAX_RATIO`-fold."""
    nbytes = float(nbytes) if nbytes < 1e300 else math.inf  # a Python int may exceed any float
    if not math.isfinite(nbytes) or nbytes > memory_budget():
        raise GradscopeError(f"{what}: needs {byte_text(nbytes)} of memory; {byte_text(memory_budget())} is available "
                             f"to one allocation on this machine")
    if present is not None and nbytes > SMALL and nbytes > MAX_RATIO * max(present, 1.0):
        raise GradscopeError(f"{what}: declares {byte_text(nbytes)} from {byte_text(present)} on disk; refusing a "
                             f"decompression bomb")


def check_tensor(value: Any, what: str, *, kind: str = "any", ndim: int | tuple[int, ...] | None = None,
                 shape: tuple[int | None, ...] | None = None) -> torch.Tensor:
    """``value`` as a plain tensor: dense, strided, on the CPU, its storage holding every element
    (a stride-0 or overlapping view that would expand when copied is refused), of ``kind``
    ('int': integer dtype, 'float': floating point, 'number': either, or 'any'), with ``ndim``
    dimensions and a matching ``shape`` (None entries are free)."""
    if not isinstance(value, torch.Tensor):
        raise GradscopeError(f"{what}: got {type(value).__name__}; expected a tensor")
    if value.layout != torch.strided or value.is_meta or value.device.type != "cpu" or value.is_quantized:
        raise GradscopeError(f"{what}: a {value.layout} tensor on {value.device}; expected a dense CPU tensor")
    dtype = value.dtype
    is_int = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    ok = {"any": True, "int": is_int, "float": dtype.is_floating_point, "number": is_int or dtype.is_floating_point,
          "complex": dtype.is_complex or dtype.is_floating_point}[kind]
    if not ok:
        raise GradscopeError(f"{what}: dtype {str(dtype).replace('torch.', '')}; expected a{'n' if kind == 'int' else ''} "
                             f"{kind} tensor")
    if ndim is not None:
        dims = (ndim,) if isinstance(ndim, int) else ndim
        if value.dim() not in dims:
            raise GradscopeError(f"{what}: has {value.dim()} dimension(s) {tuple(value.shape)}; expected "
                                 f"{' or '.join(map(str, dims))}")
    if shape is not None and (len(shape) != value.dim() or any(s is not None and s != v for s, v in zip(shape, value.shape))):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise GradscopeError(f"{what}: shape {tuple(value.shape)}; expected {want}")
    if value.numel() > 0:
        stored = value.untyped_storage().nbytes()
        if any(s == 0 for s, n in zip(value.stride(), value.shape) if n > 1) or \
                value.numel() * value.element_size() > stored:
            raise GradscopeError(f"{what}: a view of {byte_text(stored)} posing as {tuple(value.shape)} "
                                 f"(stride {tuple(value.stride())}); expected a plain tensor")
    return value


def check_ids(ids: torch.Tensor, what: str, vocab: int) -> None:
    """Token ids in [0, vocab)."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise GradscopeError(f"{what}: token ids {int(ids.min())}..{int(ids.max())} lie outside the vocabulary "
                             f"0..{vocab - 1}")


_COMPONENT = re.compile(r"^[A-Za-z0-9_.,=+@-]+$")


def safe_component(name: Any, what: str) -> str:
    """A single file-name component built from outside data: no separator, no '..', no control
    character, not hidden, at most 200 characters."""
    if not isinstance(name, str) or not name or len(name) > 200 or not _COMPONENT.match(name) \
            or name.startswith(".") or name in (".", ".."):
        raise GradscopeError(f"{what}: got {str(name)[:60]!r}; expected a plain name (letters, digits and _ . , = + @ -, "
                             f"not starting with '.')")
    return name


def inside(root: Path, path: Any, what: str) -> Path:
    """``root / path``, resolved, refused unless it stays inside ``root`` (no '..', absolute path or
    symlink out)."""
    if not isinstance(path, (str, os.PathLike)) or "\x00" in str(path):
        raise GradscopeError(f"{what}: got {str(path)[:60]!r}; expected a relative path")
    root = Path(root).resolve()
    full = (root / path).resolve()
    if full != root and root not in full.parents:
        raise GradscopeError(f"{what}: {str(path)[:80]!r} points outside {root}")
    return full


class NonFiniteWeightsWarning(GradscopeWarning):
    """A model's parameters or buffers hold NaN or Inf: every number computed from it is suspect."""


def nonfinite_tensors(module: torch.nn.Module) -> list[tuple[str, int, int]]:
    """(name, non-finite values, values) of every floating parameter and buffer of ``module`` that
    holds a NaN or Inf, in ``named_parameters``/``named_buffers`` order; a tied tensor once, under its
    first name. A meta tensor holds no values and is skipped."""
    out, seen = [], set()
    items = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    for name, t in items:
        if id(t) in seen or t.is_meta or not (t.is_floating_point() or t.is_complex()):
            continue
        seen.add(id(t))
        with torch.no_grad():  # a finite sum proves every value finite (NaN and Inf propagate); else count
            bad = 0 if bool(torch.isfinite(t.sum(dtype=torch.float64 if t.is_floating_point() else None))) \
                else int((~torch.isfinite(t)).sum())
        if bad:
            out.append((name, bad, t.numel()))
    return out


def warn_nonfinite(module: Any, what: str) -> list[tuple[str, int, int]]:
    """A :class:`NonFiniteWeightsWarning` naming the non-finite parameters and buffers of ``module``
    (``what``: where it came from, e.g. 'checkpoint: run/step-100.pt'), if there are any; returns them
    (nothing for an object that is not an ``nn.Module``)."""
    bad = nonfinite_tensors(module) if isinstance(module, torch.nn.Module) else []
    if bad:
        named = ", ".join(f"{n} ({k} of {m})" for n, k, m in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        warnings.warn(NonFiniteWeightsWarning(f"{what}: NaN or Inf weights in {len(bad)} tensor(s): {named}; every "
                                              f"number computed from this model is suspect"), stacklevel=2)
    return bad


def same_nonfinite(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` (one shape) hold NaN in the same places and the same ±Inf in the same places:
    two computations of a broken model's outputs that agree wherever they can."""
    inf = torch.isinf(a)
    return bool(torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(inf, torch.isinf(b))
                and torch.equal(a[inf], b[inf]))


# --- threads: the cores no other process wants -----------------------------------------------------
# How many torch threads an analysis should use on this machine, now.
#
# Measured on the 2-core machine this project runs on: `gradscope stability` of one GRU checkpoint took
# 18.5 s with one thread and 122 s with torch's default two while two nice-19 training processes ran
# (the same numbers either way). The products here are small (H × D matrices, one step at a time), and
# a second OpenMP thread that has to share its core with another runnable process stalls the first at
# every barrier. So a command uses the cores that no other process wants to run on, at least one: it
# counts the runnable tasks of the machine (``procs_running`` in /proc/stat, this process's sampling
# thread included) a few times over ~0.1 s, and takes the busiest count. Where that file does not exist
# (not Linux), or the user set OMP_NUM_THREADS or MKL_NUM_THREADS, torch's own choice stands.


STAT = Path("/proc/stat")
OWN_TASKS = Path("/proc/self/task")  # this process's threads
_IMPORTED_BY = os.getpid()  # a forked child (not a fresh interpreter) leaves torch's thread pool alone
SAMPLES = 5  # readings of the run queue, INTERVAL apart: a busy process shows up in nearly every one
INTERVAL = 0.02


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def task_fields(stat: Path) -> list[str]:
    """A thread's ``/proc/…/task/<tid>/stat`` fields after its name: [state, ppid, …]; [] for a thread that ended
    while read."""
    try:
        return stat.read_text().rpartition(")")[2].split()
    except OSError:
        return []


def own_running(tasks: Path | None = None) -> int:
    """This process's own runnable threads (state R in ``tasks``, its ``/proc/self/task``), at least 1 (the one
    reading): torch's OpenMP workers spin for a while after an operation, and the run queue counts them too."""
    count = sum(task_fields(stat)[:1] == ["R"] for stat in (tasks if tasks is not None else OWN_TASKS).glob("*/stat"))
    return max(1, count)


def runnable_others(stat: Path = STAT, samples: int = SAMPLES, interval: float = INTERVAL,
                    tasks: Path | None = None) -> int | None:
    """Runnable tasks other than this process's own threads (:func:`own_running`), as many as at least two of
    ``samples`` readings of ``procs_running`` show (a busy process is runnable in nearly every reading; a kernel
    worker that woke for one is not load); None where the kernel does not say (no /proc/stat)."""
    counts = []
    for k in range(samples):
        try:
            text = stat.read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("procs_running "):
                counts.append(int(line.split()[1]) - own_running(tasks))
                break
        if k + 1 < samples:
            time.sleep(interval)
    if not counts:
        return None
    counts.sort(reverse=True)
    return max(0, counts[1] if len(counts) > 1 else counts[0])


PROC = Path("/proc")
NICE0_WEIGHT = 1024  # the kernel's scheduling weight of a task at nice 0; each nice step is ×1.25 less


def queue_slowdown(threads: int, proc: Path = PROC, samples: int = SAMPLES, interval: float = INTERVAL
                   ) -> float | None:
    """How much slower ``threads`` threads of this process run now than alone, from the other processes' runnable
    threads and their nice levels (the scheduler shares the cores by weight: 1024 at nice 0, ÷1.25 a step, so
    nice-19 work weighs 15 and costs almost nothing): (1024·threads + Σ others' weights) / (1024·cores), at least
    1, at the busiest of ``samples`` readings of ``proc``'s ``<pid>/task/<tid>/stat``; None where there is no
    such directory (not Linux). A short probe misses this (the scheduler favours a task that just woke), a long
    run does not."""
    if not proc.is_dir():
        return None
    me, cores = os.getpid(), usable_cores()
    busiest = 0.0
    for k in range(samples):
        weight = 0.0
        for stat in proc.glob("[0-9]*/task/[0-9]*/stat"):
            if stat.parent.parent.parent.name == str(me):
                continue
            fields = task_fields(stat)
            try:
                if fields[0] == "R":
                    weight += NICE0_WEIGHT / 1.25 ** int(fields[16])
            except (IndexError, ValueError):  # a task that ended while read
                continue
        busiest = max(busiest, weight)
        if k + 1 < samples:
            time.sleep(interval)
    return max(1.0, (NICE0_WEIGHT * threads + busiest) / (NICE0_WEIGHT * cores))


def free_cores(stat: Path = STAT) -> int | None:
    """Usable cores that no other runnable task is waiting for, at least 1; None where unknown."""
    others = runnable_others(stat)
    return None if others is None else max(1, usable_cores() - others)


def choose_threads(stat: Path = STAT, env: dict[str, str] | None = None) -> int | None:
    """The thread count for an analysis now: the free cores, unless the environment sets one
    (OMP_NUM_THREADS, MKL_NUM_THREADS) or the machine does not tell (then None: leave torch's)."""
    env = os.environ if env is None else env
    if env.get("OMP_NUM_THREADS") or env.get("MKL_NUM_THREADS"):
        return None
    return free_cores(stat)


def use_free_cores() -> tuple[int, int]:
    """Set torch's intra-op threads to :func:`choose_threads` (where it has an answer): (threads now,
    usable cores). Commands call this once before their work; from Python call it yourself if you
    share the machine."""
    if os.getpid() != _IMPORTED_BY:  # resizing the OpenMP pool a forked parent had started can hang the child
        return torch.get_num_threads(), usable_cores()
    chosen = choose_threads()
    if chosen is not None and chosen != torch.get_num_threads():
        torch.set_num_threads(chosen)
    return torch.get_num_threads(), usable_cores()
