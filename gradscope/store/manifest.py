"""The index of a sweep: ``sweep.json`` in the sweep directory, written by the client alone.

Workers write only their own run directories and stores (disjoint paths, each atomic); the
client rewrites this one small JSON file atomically whenever a grid point finishes. It lists every
grid point with its axis values, status, outputs (paths relative to the sweep directory) and, for
a failed point, its error. ``summarize`` and ``report`` accept the sweep directory (or this file)
in place of a list of stores.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

from gradscope.errors import GradscopeError, check
from gradscope.guard import inside
from gradscope.files.io import atomic_write_text

MANIFEST = "sweep.json"
MANIFEST_FORMAT = "gradscope-sweep"
MANIFEST_VERSION = 1
OUTPUTS = ("run", "accuracy", "stability")  # what a grid point may produce
STATUSES = ("done", "failed", "pending")


def manifest_path(path: Path) -> Path | None:
    """``path`` itself if it is a sweep manifest, ``path/sweep.json`` if it is a sweep directory,
    else None."""
    path = Path(path)
    if path.is_file() and path.name == MANIFEST:
        return path
    if path.is_dir() and (path / MANIFEST).is_file():
        return path / MANIFEST
    return None


def write_manifest(root: Path, header: dict[str, Any], points: list[dict[str, Any]]) -> Path:
    """Atomically (re)write ``root/sweep.json``. Each point: name, axes, status, outputs
    ({run, accuracy, stability}: relative path or None), error, seconds, worker."""
    for p in points:
        check(p["status"] in STATUSES, f"manifest: status {p['status']!r} of {p['name']} is not one of {STATUSES}")
    doc = {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION,
           "updated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **header, "points": points}
    path = Path(root) / MANIFEST
    atomic_write_text(path, json.dumps(doc, indent=2, default=str) + "\n")
    return path


MAX_MANIFEST = 64 << 20  # bytes; a manifest lists points, not data


def _check_point(point: Any, found: Path) -> None:
    """A point as ``write_manifest`` writes it: a name, a known status, outputs mapping output kinds to
    relative paths or null."""
    what = f"sweep: {found}"
    if not isinstance(point, dict) or not isinstance(point.get("name"), str):
        raise GradscopeError(f"{what} has a point {str(point)[:60]!r}; expected an object with a name")
    name = point["name"][:60]
    if point.get("status") not in STATUSES:
        raise GradscopeError(f"{what}: point {name!r} has status {str(point.get('status'))[:30]!r}; expected one of "
                             f"{', '.join(STATUSES)}")
    outputs = point.get("outputs")
    if outputs is None:
        return
    if not isinstance(outputs, dict) or not all(isinstance(v, str) or v is None for v in outputs.values()):
        raise GradscopeError(f"{what}: point {name!r} has outputs {str(outputs)[:60]!r}; expected an object "
                             f"mapping {', '.join(OUTPUTS)} to paths relative to the sweep directory, or null")
    for kind, rel in outputs.items():
        if rel:
            inside(found.parent, rel, f"{what}: output {str(kind)[:20]} of point {name!r}")


def read_manifest(path: Path) -> dict[str, Any]:
    """A sweep manifest, checked; ``path`` is the file or the sweep directory."""
    found = manifest_path(path)
    check(found is not None, f"sweep: {path} is not a sweep directory (no {MANIFEST})")
    assert found is not None
    try:
        if found.stat().st_size > MAX_MANIFEST:
            raise GradscopeError(f"sweep: {found} is larger than {MAX_MANIFEST >> 20} MB; not a sweep manifest")
        doc = json.loads(found.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else \
            "not UTF-8" if isinstance(exc, UnicodeDecodeError) else f"{type(exc).__name__}: {exc}"
        raise GradscopeError(f"sweep: cannot read {found} ({reason[:160]})") from None
    check(isinstance(doc, dict) and doc.get("format") == MANIFEST_FORMAT and isinstance(doc.get("points"), list),
          f"sweep: {found} is not a gradscope sweep manifest")
    for point in doc["points"]:
        _check_point(point, found)
    return doc


def manifest_outputs(path: Path, kinds: tuple[str, ...]) -> list[Path]:
    """The existing outputs of the finished grid points of a sweep, of the given kinds (run,
    accuracy, stability), as paths; in grid order, kinds in the order given. A path that leads
    outside the sweep directory is refused."""
    for kind in kinds:
        check(kind in OUTPUTS, f"sweep: unknown output kind {kind!r}; valid kinds are {', '.join(OUTPUTS)}")
    found = manifest_path(path)
    doc = read_manifest(path)
    assert found is not None
    root = found.parent
    out = []
    for kind in kinds:
        for point in doc["points"]:
            rel = (point.get("outputs") or {}).get(kind)
            if point["status"] != "done" or not rel:
                continue
            if (root / rel).exists():  # inside the sweep: read_manifest checked
                out.append(root / rel)
    return out
