"""Sweeps: a TOML spec → grid points → one task per point (train → accuracy → stability).

This module is the pure part: parsing and checking the spec, expanding the grid, and the task that
runs one point (what a dask worker executes). Scheduling lives in :mod:`gradscope.workflows.sweep.cluster`.

A spec (see ``docs/sweep-tiny.toml``)::

    name = "tiny-grid"
    preset = "tiny"                 # base configuration; [settings] overrides it
    [settings]                      # any `gradscope train` setting, e.g. hidden_size = 32
    iterations = 400
    [axes]                          # every combination of these lists is one grid point
    pe = ["none", "sinusoidal"]
    vocab_size = [16, 32]
    [accuracy]                      # omit the table to skip the analysis
    checkpoints = "all"             # "all", "last" or a list of iterations
    [stability]
    checkpoints = "last"
    target_freq = ["rare"]
    disturbant = ["frequent", "rare"]
    triplets = 16
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gradscope.errors import GradscopeError, check
from gradscope.guard import safe_component
from gradscope.presets import BETAS, PRESETS, build_config
from gradscope.presets import settings as settings_of_a_run
from gradscope.store.io import write_store
from gradscope.train.loop import EVAL_FILE, is_run_dir, read_run_config
from gradscope.workflows.accuracy import AccuracyOptions
from gradscope.files.lock import point_lock
from gradscope.workflows.study.reproduce import (Layout, PlannedRun, accuracy_step, check_run_sizes, stability_step,
                                           train_step)
from gradscope.workflows.common import conditions_for
from gradscope.workflows.stability import StabilityOptions
from gradscope.tasks.registry import probe_tasks

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SPEC_KEYS = ("name", "preset", "settings", "axes", "accuracy", "stability")
ACCURACY_KEYS = ("checkpoints", "bins", "device")
STABILITY_KEYS = ("checkpoints", "target_freq", "disturbant", "triplets", "target_pos", "seed", "device")
Checkpoints = str | tuple[int, ...]  # "all", "last" or iterations
MAX_SPEC_BYTES = 1 << 20  # a spec is a few lines; more is a mistake (or an attack)
MAX_POINTS = 10_000  # grid points of one sweep
MAX_TEXT = 200  # characters of a string value in a spec


@dataclass(frozen=True)
class Analyses:
    """What runs on each trained point; None skips an analysis."""

    accuracy: AccuracyOptions | None = AccuracyOptions()
    accuracy_checkpoints: Checkpoints = "all"
    stability: StabilityOptions | None = StabilityOptions(triplets=16)
    stability_checkpoints: Checkpoints = "all"

    def describe(self) -> dict[str, Any]:
        """JSON-ready description (stored in the manifest; a re-run must match it)."""
        def opts(o: Any) -> Any:
            if isinstance(o, AccuracyOptions):  # the values used (None: the default), as manifests have held them
                o = dataclasses.replace(o, resamples=o.resamples_used, seed=o.seed_used)
            return None if o is None else {k: (str(v) if isinstance(v, Path) else v)
                                           for k, v in dataclasses.asdict(o).items()}
        described = {"accuracy": opts(self.accuracy), "accuracy_checkpoints": self.accuracy_checkpoints,
                     "stability": opts(self.stability), "stability_checkpoints": self.stability_checkpoints}
        return json.loads(json.dumps(described))  # as the manifest will hold it (tuples become lists)


@dataclass(frozen=True)
class SweepSpec:
    name: str
    preset: str
    settings: tuple[tuple[str, Any], ...]
    axes: tuple[tuple[str, tuple[Any, ...]], ...]
    analyses: Analyses


@dataclass(frozen=True)
class SweepPoint:
    """One grid point: its run (name and configuration) and its axis values."""

    run: PlannedRun
    axes: tuple[tuple[str, Any], ...]

    @property
    def name(self) -> str:
        return self.run.name


@dataclass(frozen=True)
class PointOutcome:
    """What one task did: each step's result ("trained", "resumed", "written", "done earlier"),
    wall-clock seconds, and where it ran."""

    name: str
    steps: tuple[tuple[str, str], ...]
    seconds: float
    worker: str
    threads: int


def _unknown(where: str, given: Any, valid: tuple[str, ...]) -> None:
    bad = sorted(set(given) - set(valid))
    check(not bad, f"spec: unknown key(s) {', '.join(map(repr, bad))} in {where}; valid keys are {', '.join(valid)}")


def _checkpoints(where: str, value: Any) -> Checkpoints:
    if value in ("all", "last"):
        return str(value)
    ok = isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                   for v in value)
    check(bool(ok), f"spec: [{where}] checkpoints: got {value!r}; give \"all\", \"last\" or a list of iterations "
                    f"such as [500, 1000]")
    return tuple(sorted(set(value)))


def _scalar(where: str, value: Any) -> Any:
    """A setting or axis value: a number, a boolean or a short string (no table, list or date)."""
    ok = isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= MAX_TEXT)
    check(ok, f"spec: {where}: got {str(value)[:60]!r} ({type(value).__name__}); expected a number, a boolean or "
              f"a string of at most {MAX_TEXT} characters")
    return value


def _text(where: str, key: str, value: Any) -> str:
    check(isinstance(value, str) and 0 < len(value) <= MAX_TEXT,
          f"spec: [{where}] {key}: got {str(value)[:60]!r}; expected a string such as \"auto\"")
    return value


def _groups(where: str, key: str, value: Any) -> tuple[str, ...]:
    value = [value] if isinstance(value, str) else value
    check(isinstance(value, list) and all(isinstance(v, str) for v in value),
          f"spec: [{where}] {key}: got {value!r}; give a list of groups such as [\"frequent\", \"rare\"]")
    return tuple(value)


def _int(where: str, key: str, value: Any, minimum: int) -> int:
    check(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
          f"spec: [{where}] {key}: got {value!r}; expected an integer >= {minimum}")
    return int(value)


def _analyses(doc: dict[str, Any]) -> Analyses:
    acc, acc_ckpt = None, "all"
    if "accuracy" in doc:
        table = doc["accuracy"]
        check(isinstance(table, dict), "spec: accuracy must be a table ([accuracy])")
        _unknown("[accuracy]", table, ACCURACY_KEYS)
        bins = table.get("bins")
        bins = None if bins is None else _int("accuracy", "bins", bins, 1) if not isinstance(bins, list) else tuple(
            _int("accuracy", "bins", b, 0) for b in bins)
        acc = AccuracyOptions(bins=bins, device=_text("accuracy", "device", table.get("device", "auto")))
        acc_ckpt = _checkpoints("accuracy", table.get("checkpoints", "all"))
    stab, stab_ckpt = None, "all"
    if "stability" in doc:
        table = doc["stability"]
        check(isinstance(table, dict), "spec: stability must be a table ([stability])")
        _unknown("[stability]", table, STABILITY_KEYS)
        try:
            stab = StabilityOptions(target_freq=_groups("stability", "target_freq", table.get("target_freq", [])),
                                    disturbant=_groups("stability", "disturbant", table.get("disturbant", [])),
                                    triplets=_int("stability", "triplets", table.get("triplets", 16), 1),
                                    target_pos=_int("stability", "target_pos", table.get("target_pos", 1), 1),
                                    seed=_int("stability", "seed", table.get("seed", 0), 0),
                                    device=_text("stability", "device", table.get("device", "auto")))
        except GradscopeError as exc:
            raise GradscopeError(str(exc) if str(exc).startswith("spec:") else f"spec: [stability] {exc}") from None
        stab_ckpt = _checkpoints("stability", table.get("checkpoints", "all"))
    return Analyses(acc, acc_ckpt, stab, stab_ckpt)


def parse_spec(text: str, source: str = "spec") -> SweepSpec:
    """Parse and check a TOML sweep spec; user errors name the key and what is valid."""
    check(len(text) <= MAX_SPEC_BYTES, f"spec: {source} has {len(text)} characters; a spec is at most {MAX_SPEC_BYTES}")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise GradscopeError(f"spec: {source} is not valid TOML ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise GradscopeError(f"spec: {source} nests arrays or tables too deeply") from None
    _unknown("the spec", doc, SPEC_KEYS)
    preset = doc.get("preset", "tiny")
    check(isinstance(preset, str) and preset in PRESETS,
          f"spec: preset: got {str(preset)[:60]!r}; valid presets are {', '.join(PRESETS)}")
    settings = doc.get("settings", {})
    axes = doc.get("axes", {})
    check(isinstance(settings, dict), "spec: settings must be a table ([settings])")
    check(isinstance(axes, dict) and bool(axes), "spec: give at least one axis in [axes], e.g. seed = [1, 2]")
    names = settings_of_a_run()  # the registered cores' own options included
    _unknown("[settings]", settings, (*names, *BETAS))
    _unknown("[axes]", axes, names)
    both = sorted(set(settings) & set(axes))
    check(not both, f"spec: {', '.join(both)} is both a setting and an axis; keep it in one place")
    for key, value in settings.items():
        _scalar(f"[settings] {key}", value)
    points = 1
    for key, values in axes.items():
        check(isinstance(values, list) and len(values) > 0,
              f"spec: [axes] {key}: got {str(values)[:60]!r}; give a non-empty list of values")
        for v in values:
            _scalar(f"[axes] {key}", v)
        check(len({repr(v) for v in values}) == len(values),
              f"spec: [axes] {key}: repeated values in {str(values)[:80]}")
        points *= len(values)
    check(points <= MAX_POINTS, f"spec: [axes] span {points} grid points; a sweep has at most {MAX_POINTS}")
    # the name becomes a directory (sweep-<name>): one plain component, never a path
    name = safe_component(doc.get("name", "sweep"), "spec: name")
    return SweepSpec(name, preset, tuple(settings.items()), tuple((k, tuple(v)) for k, v in axes.items()),
                     _analyses(doc))


def read_spec(path: Path) -> SweepSpec:
    path = Path(path)
    check(path.is_file(), f"spec: {path} does not exist or is not a file")
    try:
        check(path.stat().st_size <= MAX_SPEC_BYTES,
              f"spec: {path} has {path.stat().st_size} bytes; a spec is at most {MAX_SPEC_BYTES}")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GradscopeError(f"spec: cannot read {path} ({type(exc).__name__})") from None
    return parse_spec(text, str(path))


def _tag(axis: str, value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.+_-]", "_", f"{axis}{value}")


def point_name(config: Any, axes: tuple[tuple[str, Any], ...]) -> str:
    """<core>-<pe>-K<vocab>[-<other axis><value>…]-s<seed>: readable and unique within a grid."""
    named = ("core", "model", "pe", "vocab_size", "vocab", "seed")  # the old names keep a grid's point names
    extra = [_tag(a, v) for a, v in axes if a not in named]
    task = [config.task.name] if any(a == "task" for a, _ in axes) else []
    return "-".join([*task, config.model.core, config.model.pe, f"K{config.task.vocab_size}", *extra,
                     f"s{config.train.seed}"])


def _check_point(point: SweepPoint, analyses: Analyses) -> None:
    cfg, name = point.run.config, point.name
    every, total = cfg.train.checkpoint_every, cfg.train.iterations
    saved = set(range(every, total + 1, every)) | {total}
    for which, chosen in (("accuracy", analyses.accuracy_checkpoints), ("stability", analyses.stability_checkpoints)):
        if isinstance(chosen, tuple):
            missing = sorted(set(chosen) - saved)
            check(not missing, f"spec: [{which}] checkpoints: {name} saves checkpoints every {every} of {total} "
                               f"iterations, so there is none at {', '.join(map(str, missing))}")
    if analyses.stability is not None:
        check(cfg.task.name in probe_tasks(), f"spec: [stability] {name} trains on {cfg.task.name!r}; stability "
                                                f"probes are defined for {', '.join(probe_tasks())}")
        try:
            conditions_for(cfg.task, analyses.stability.target_freq, analyses.stability.disturbant)
        except GradscopeError as exc:
            raise GradscopeError(f"spec: [stability] {name}: {exc}") from None
        check(1 <= analyses.stability.target_pos <= cfg.task.length,
              f"spec: [stability] target_pos: got {analyses.stability.target_pos}; {name} has positions 1…{cfg.task.length}")
    chosen = analyses.stability_checkpoints
    try:
        check_run_sizes(point.run, analyses.stability, None if chosen == "all" else 1 if chosen == "last" else len(chosen))
    except GradscopeError as exc:
        raise GradscopeError(f"spec: {exc}") from None


def plan_points(spec: SweepSpec) -> list[SweepPoint]:
    """Every combination of the axes (the last axis varies fastest), each a checked run."""
    names = [a for a, _ in spec.axes]
    points = []
    for values in itertools.product(*(v for _, v in spec.axes)):
        axes = tuple(zip(names, values))
        options = {**dict(spec.settings), **dict(axes)}
        try:
            config = build_config(spec.preset, options)
        except GradscopeError as exc:
            where = ", ".join(f"{a}={v}" for a, v in axes)
            raise GradscopeError(f"spec: at {where}: {exc}") from None
        point = SweepPoint(PlannedRun(safe_component(point_name(config, axes), "spec: point name"), config), axes)
        _check_point(point, spec.analyses)
        points.append(point)
    seen: dict[str, SweepPoint] = {}
    for p in points:
        if p.name in seen:
            raise GradscopeError(f"spec: two grid points share the name {p.name} ({dict(seen[p.name].axes)} and "
                                 f"{dict(p.axes)}); they would write the same run")
        seen[p.name] = p
    return points


def point_outputs(point: SweepPoint, layout: Layout, analyses: Analyses) -> dict[str, Path | None]:
    """Where a point's outputs go (None: that analysis is not run)."""
    return {"run": layout.run(point.run),
            "accuracy": layout.accuracy(point.run) if analyses.accuracy is not None else None,
            "stability": layout.stability(point.run) if analyses.stability is not None else None}


def point_finished(point: SweepPoint, layout: Layout, analyses: Analyses) -> bool:
    """Every output of the point exists (a finished run has its held-out evaluation)."""
    out = point_outputs(point, layout, analyses)
    return (out["run"] / EVAL_FILE).is_file() and all(p.exists() for k, p in out.items() if k != "run" and p)


def lock_path(point: SweepPoint, layout: Layout) -> Path:
    """The point's runner lock (see :mod:`gradscope.files.lock`)."""
    return layout.run(point.run).parent / f".{point.name}.lock"


def clear_point_temporaries(point: SweepPoint, layout: Layout) -> None:
    """Temporary files and stores left by a task that was killed mid-write (the real outputs are
    only ever renamed into place, so these are never needed). Unlike
    :func:`gradscope.files.publish.remove_stale_temporaries`, which spares a live writer's, this
    removes every one: it runs under the point's lock, on any host, so no writer of them is left."""
    run_dir, stores = layout.run(point.run), layout.accuracy(point.run).parent
    for folder, prefixes in ((run_dir, (".",)), (stores, (f".accuracy-{point.name}.zarr.", f".stability-{point.name}.zarr."))):
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            if p.name.startswith(prefixes) and p.name.endswith((".tmp", ".old")):
                shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)


def _write(ds: Any, path: Path | None) -> str:
    """Write a step's store (None: it existed). A store that appeared meanwhile — a copy of this
    task that dask started elsewhere after losing contact with this worker — is kept, not replaced."""
    if ds is None or path is None:
        return "done earlier"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_store(ds, path)
    except GradscopeError:
        if path.exists():
            return "done earlier"
        raise
    return "written"


def run_point(point: SweepPoint, root: str, analyses: Analyses, threads: int, command: str = "") -> PointOutcome:
    """The task of one grid point: train (or resume, or skip), then the analyses whose stores are
    missing. Every output is written atomically, so a task killed at any moment can be re-run. A
    second runner of the same point at the same time is refused (a user error naming the first)."""
    tic = time.perf_counter()
    torch.set_num_threads(max(1, threads))
    layout = Layout(Path(root))
    with point_lock(lock_path(point, layout), f"point {point.name}"):
        clear_point_temporaries(point, layout)  # safe: no other runner of this point exists now
        steps = [("train", train_step(point.run, layout, command=command))]
        out = point_outputs(point, layout, analyses)
        if analyses.accuracy is not None:
            ds = accuracy_step(point.run, layout, command, analyses.accuracy, analyses.accuracy_checkpoints)
            steps.append(("accuracy", _write(ds, out["accuracy"])))
        if analyses.stability is not None:
            ds = stability_step(point.run, layout, analyses.stability, command, analyses.stability_checkpoints)
            steps.append(("stability", _write(ds, out["stability"])))
    return PointOutcome(point.name, tuple(steps), time.perf_counter() - tic, f"{socket.gethostname()}:{os.getpid()}",
                        torch.get_num_threads())


def manifest_entry(point: SweepPoint, layout: Layout, analyses: Analyses, status: str,
                   outcome: PointOutcome | None = None, error: str | None = None) -> dict[str, Any]:
    """One point of the sweep's manifest (paths relative to the sweep directory)."""
    outputs = {k: (str(p.relative_to(layout.root)) if p is not None else None)
               for k, p in point_outputs(point, layout, analyses).items()}
    entry: dict[str, Any] = {"name": point.name, "axes": dict(point.axes), "status": status, "outputs": outputs,
                             "error": error}
    if outcome is not None:
        entry.update(steps=dict(outcome.steps), seconds=round(outcome.seconds, 3), worker=outcome.worker,
                     threads=outcome.threads)
    return entry


def check_existing(points: list[SweepPoint], layout: Layout) -> None:
    """Refuse to mix runs: a point whose run directory was started with another configuration."""
    clash = [p.name for p in points if is_run_dir(layout.run(p.run)) and read_run_config(layout.run(p.run)) != p.run.config]
    check(not clash, f"out: {layout.root} holds run(s) started with a different configuration than this spec "
                     f"({', '.join(clash[:5])}{' …' if len(clash) > 5 else ''}); choose another out (--out) or restore the spec")
