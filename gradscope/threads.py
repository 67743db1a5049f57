"""How many torch threads an analysis should use on this machine, now.

Measured on the 2-core machine this project runs on: `gradscope stability` of one GRU checkpoint took
18.5 s with one thread and 122 s with torch's default two while two nice-19 training processes ran
(the same numbers either way). The products here are small (H × D matrices, one step at a time), and
a second OpenMP thread that has to share its core with another runnable process stalls the first at
every barrier. So a command uses the cores that no other process wants to run on, at least one: it
counts the runnable tasks of the machine (``procs_running`` in /proc/stat, this process's sampling
thread included) a few times over ~0.1 s, and takes the busiest count. Where that file does not exist
(not Linux), or the user set OMP_NUM_THREADS or MKL_NUM_THREADS, torch's own choice stands.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

STAT = Path("/proc/stat")
SAMPLES = 5  # readings of the run queue, INTERVAL apart: a busy process shows up in at least one
INTERVAL = 0.02


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def runnable_others(stat: Path = STAT, samples: int = SAMPLES, interval: float = INTERVAL) -> int | None:
    """Runnable tasks other than this one, at the busiest of ``samples`` readings of ``procs_running``;
    None where the kernel does not say (no /proc/stat)."""
    busiest = None
    for k in range(samples):
        try:
            text = stat.read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("procs_running "):
                count = int(line.split()[1])
                busiest = count if busiest is None else max(busiest, count)
                break
        if k + 1 < samples:
            time.sleep(interval)
    return None if busiest is None else max(0, busiest - 1)


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
    import torch

    chosen = choose_threads()
    if chosen is not None and chosen != torch.get_num_threads():
        torch.set_num_threads(chosen)
    return torch.get_num_threads(), usable_cores()
