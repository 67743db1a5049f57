"""Run sweep points on dask.distributed: a LocalCluster by default, or an existing scheduler.

The client submits one task per unfinished grid point (:func:`gradscope.workflows.sweep.grid.run_point`),
watches them, and is the only writer of the sweep's manifest. Workers write their own run
directories and stores, so the output directory must be visible to every worker (one machine,
or a shared filesystem). A worker that dies mid-task has its task rescheduled by the scheduler;
the re-run resumes training from the last checkpoint and redoes only missing stores.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

from gradscope.errors import GradscopeError, check
from gradscope.guard import check_bytes
from gradscope.workflows.study.options import ClusterOptions  # declared torch-free (sweep --help)
from gradscope.workflows.sweep.grid import Analyses, PointOutcome, SweepPoint, run_point

WORKER_BYTES = 256 << 20  # a local worker process, before any work: interpreter, torch, dask


@dataclass
class Tally:
    """Live counts for the progress display."""

    total: int
    done: int = 0
    failed: int = 0
    running: int = 0
    finished: list[PointOutcome] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)  # point name → one-line error


def cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    if name == "KilledWorker":
        return f"KilledWorker: the worker running it died repeatedly (out of memory, or killed): {text[:300]}"
    return text[:500] if isinstance(exc, GradscopeError) else f"{name}: {text[:500]}"


def check_workers(opts: ClusterOptions, points: int | None = None) -> int:
    """The local cluster's worker processes (``opts.workers``, else the cores, at most one per point),
    refused when their start-up memory does not fit (a machine's limit, so not ClusterOptions' own
    check: that is torch-free, for the help); checked before anything is written."""
    workers = opts.workers or max(1, min(cores(), points or 1))
    check_bytes(workers * WORKER_BYTES, "workers")
    return workers


@contextmanager
def open_client(opts: ClusterOptions, points: int) -> Iterator[Any]:
    """A dask client: attached to ``opts.scheduler``, or to a new LocalCluster that is shut down
    on exit. Logs of the cluster below ERROR are silenced (the progress bar speaks instead)."""
    import dask
    from distributed import Client, LocalCluster
    if opts.scheduler is not None:
        try:
            client = Client(opts.scheduler, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:  # ValueError: dask refused the address
            raise GradscopeError(f"scheduler: cannot reach a dask scheduler at {opts.scheduler} "
                                 f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
        try:
            _check_remote(client, opts)
            yield client
        finally:
            client.close()
        return
    workers = check_workers(opts, points)
    # dask's nannies export MALLOC_TRIM_THRESHOLD_=65536 to their workers (for numpy-array
    # workloads); it made one tiny-grid point ~13% slower here (6.1 → 6.9 s), so local workers keep
    # glibc's adaptive default.
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                               resources=opts.resources or None, silence_logs=logging.ERROR)
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def _check_remote(client: Any, opts: ClusterOptions) -> None:
    try:
        client.wait_for_workers(1, timeout=30)
    except TimeoutError:
        raise GradscopeError(f"scheduler: no worker joined {opts.scheduler} within 30 s; start some with "
                             f"`dask worker {opts.scheduler}`") from None
    workers = client.scheduler_info()["workers"].values()
    for name, amount in opts.resources.items():
        check(any(w.get("resources", {}).get(name, 0) >= amount for w in workers),
              f"resources: no worker of {opts.scheduler} offers {name}={amount:g}; start workers with "
              f"`dask worker {opts.scheduler} --resources {name}={amount:g}`")


def dashboard_link(client: Any) -> str | None:
    """The dask dashboard's URL, when the scheduler serves one."""
    try:
        return client.dashboard_link if "dashboard" in client.scheduler_info().get("services", {}) else None
    except (KeyError, OSError):
        return None


def host_slots(client: Any) -> dict[str, int]:
    """Task slots (worker threads) per host, over all workers the scheduler knows now."""
    slots: dict[str, int] = {}
    for w in client.scheduler_info()["workers"].values():
        slots[str(w.get("host", ""))] = slots.get(str(w.get("host", "")), 0) + int(w.get("nthreads", 1))
    return slots


def threads_here(slots: dict[str, int], host: str) -> int:
    """torch threads for one task: this host's cores shared among its task slots (≥ 1), so that
    slots × threads ≤ cores."""
    return max(1, cores() // max(1, slots.get(host, 1)))


def run_point_on_worker(point: SweepPoint, root: str, analyses: Analyses, threads: int | None,
                        slots: dict[str, int], command: str) -> PointOutcome:
    """:func:`run_point` with ``threads`` torch threads, or (None) the share of this worker's host."""
    if threads is None:
        from distributed import get_worker
        threads = threads_here(slots, urlparse(get_worker().address).hostname or "")
    return run_point(point, root, analyses, threads, command)


def run_sweep(client: Any, points: list[SweepPoint], root: Path, analyses: Analyses, opts: ClusterOptions,
              command: str, on_update: Callable[[Tally], None], on_finish: Callable[[Tally], None] | None = None,
              poll: float = 0.5) -> Tally:
    """Submit every point, then poll until all have finished or failed; ``on_update(tally)`` after
    every poll and ``on_finish(tally)`` whenever a point ends (the manifest is written there)."""
    tally = Tally(total=len(points))
    slots = host_slots(client)
    stamp = f"{os.getpid()}-{time.time_ns()}"
    futures = {}
    for p in points:
        futures[client.submit(run_point_on_worker, p, str(root), analyses, opts.threads, slots, command,
                              key=f"gradscope-{p.name}-{stamp}", pure=False, retries=opts.retries,
                              resources=opts.resources or None)] = p.name
    pending = set(futures)
    ours = {f.key for f in futures}
    while pending:
        ended = [f for f in pending if f.done()]
        for f in ended:
            pending.discard(f)
            name = futures[f]
            if f.status == "finished":
                try:
                    outcome = f.result()
                except Exception as exc:  # noqa: BLE001 - a lost result is a failed point, not a crash
                    tally.failed += 1
                    tally.failures[name] = _describe(exc)
                else:
                    tally.done += 1
                    tally.finished.append(outcome)
            else:
                exc = f.exception() if f.status == "error" else None
                tally.failed += 1
                tally.failures[name] = _describe(exc) if exc is not None else f"task {f.status}"
            if on_finish is not None:
                on_finish(tally)
        try:
            tally.running = sum(1 for keys in client.processing().values() for k in keys if k in ours)
        except OSError:
            tally.running = 0
        on_update(tally)
        if pending:
            time.sleep(poll)
    return tally
