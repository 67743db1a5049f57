"""Real small stores, runs and a sweep for the store-boundary hardening tests (issue #15).

Built once per session (``built``) and copied per test (``fresh``), so a test may mutate its copy.
Not a test module: it holds the builders that both ``test_hardening_stores*.py`` files share.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np

from tests.helpers.fuzzkit import invoke

_BUILT: dict[str, Path] = {}

STAB = ("--triplets", "2", "--resamples", "20", "-q")
DYN = ("--sequences", "1", "--grid-sequences", "1", "--trajectories", "1", "--steps", "12", "--lyap-warmup", "2", "-q")
FAST = ("--resamples", "20")  # summarize/report: few bootstrap resamples, the numbers are compared exactly anyway


def _ok(args: list[object]) -> None:
    outcome = invoke(args)
    assert outcome.rc == 0 and outcome.exc is None, f"{args}: {outcome.err}{outcome.tb}"


def built(base: Path) -> dict[str, Path]:
    """One trained run; its accuracy, stability and dynamics stores; a stability store whose scores
    hold NaN (as a diverged checkpoint leaves them); a summary store; and a sweep directory whose
    manifest lists the run and both stores."""
    if _BUILT:
        return _BUILT
    from tests.helpers.runs import small_run
    from gradscope.store import read_store, write_store
    from gradscope.store.manifest import write_manifest
    from gradscope.train import train

    names = {"run": "run", "accuracy": "acc.zarr", "stability": "st.zarr", "dynamics": "dyn.zarr",
             "summary": "sum.zarr", "nan": "nan.zarr", "sweep": "sweep"}
    if (base / "complete").exists():  # built by an earlier process (a scratch session)
        _BUILT.update({k: base / v for k, v in names.items()})
        return _BUILT
    base.mkdir(parents=True, exist_ok=True)
    cfg = small_run(iterations=10)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, checkpoint_every=10))
    run = base / "run"
    train(cfg, run)
    out = {"run": run, "accuracy": base / "acc.zarr", "stability": base / "st.zarr", "dynamics": base / "dyn.zarr",
           "summary": base / "sum.zarr", "nan": base / "nan.zarr"}
    _ok(["accuracy", run, "-o", out["accuracy"], "-q"])
    _ok(["stability", run, "-o", out["stability"], *STAB])
    _ok(["dynamics", run, "-o", out["dynamics"], *DYN])
    _ok(["summarize", out["accuracy"], "-o", out["summary"], *FAST])
    ds = read_store(out["stability"])
    scores = ds["score_default"].values.copy()
    scores[-1, :, 0] = np.nan  # the first triplet's scores at the last checkpoint: NaN in both pairs
    ds["score_default"] = (ds["score_default"].dims, scores)
    write_store(ds, out["nan"])
    sweep = base / "sweep"
    (sweep / "stores").mkdir(parents=True)
    shutil.copytree(run, sweep / "run")
    shutil.copytree(out["accuracy"], sweep / "stores" / "acc.zarr")
    shutil.copytree(out["stability"], sweep / "stores" / "st.zarr")
    write_manifest(sweep, {"name": "tiny"}, [
        {"name": "p1", "axes": {"seed": 7}, "status": "done", "error": None,
         "outputs": {"run": "run", "accuracy": "stores/acc.zarr", "stability": "stores/st.zarr"}}])
    out["sweep"] = sweep
    assert out == {k: base / v for k, v in names.items()}
    (base / "complete").touch()
    _BUILT.update(out)
    return _BUILT


def fresh(base: Path, into: Path) -> dict[str, Path]:
    """A private copy of everything ``built`` made."""
    src = built(base)
    into.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, path in src.items():
        out[key] = into / path.name
        if not out[key].exists():
            shutil.copytree(path, out[key], symlinks=True)
    return out


def snapshot(root: Path) -> dict[str, str]:
    """fuzzkit.snapshot that never follows a link or opens a FIFO or device (a mutation may leave
    a link to /dev/zero, which fuzzkit's version would read forever): links as their target,
    other special files by their type."""
    import hashlib
    import stat
    found: dict[str, str] = {}
    for p in sorted(Path(root).rglob("*")):
        rel = str(p.relative_to(root))
        mode = p.lstat().st_mode
        if stat.S_ISLNK(mode):
            found[rel] = f"link {p.readlink()}"
        elif stat.S_ISDIR(mode):
            found[rel] = "dir"
        elif stat.S_ISREG(mode):
            found[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            found[rel] = f"special {stat.S_IFMT(mode)}"
    return found


def chunk_files(store: Path) -> list[Path]:
    """Every chunk file of a store (files under some VARIABLE/c/)."""
    return sorted(p for p in store.rglob("*") if p.is_file() and "c" in p.relative_to(store).parts[1:2])
