"""Zarr (v3) stores: atomic writes, checked reads, provenance attributes.

A store is written to a temporary sibling directory and renamed into place, so a killed run never
leaves a half-written store. An existing store is replaced only with ``overwrite=True``, and then
the old one is moved aside first and removed only after the new one is in place.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import xarray as xr

from gradscope.errors import GradscopeError
from gradscope.guard import WRITE_ERRORS, disk_error, publish, remove_stale_temporaries, temp_path
from gradscope.version import __version__

STORE_KINDS = ("stability", "accuracy", "summary", "dynamics")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def provenance(kind: str, command: str, device: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Attributes every store carries. Nested values are JSON strings (portable zarr attributes)."""
    attrs: dict[str, Any] = {
        "kind": kind, "gradscope_version": __version__, "torch_version": str(torch.__version__),
        "device": device, "host": platform.node(), "command": command,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    for key, value in (extra or {}).items():
        attrs[key] = value if isinstance(value, (str, int, float, bool)) else json.dumps(value)
    return attrs


def write_store(ds: xr.Dataset, path: Path, overwrite: bool = False) -> Path:
    """Write ``ds`` to a zarr v3 store at ``path`` atomically (a temporary sibling, then a rename).

    Without ``overwrite`` an existing store is never replaced, even one that a concurrent writer
    renamed into place while this one was writing. Temporaries left by killed writers of the same
    store are removed first."""
    path = Path(path)
    if not path.parent.is_dir():
        raise GradscopeError(f"out: directory {path.parent} does not exist")
    remove_stale_temporaries(path.parent, path.name)
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise GradscopeError(f"out: {path} already exists; choose another path or pass overwrite=True")
    tmp = temp_path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # zarr v3 notes on consolidated metadata
            ds.to_zarr(tmp, mode="w-", zarr_format=3, consolidated=False)
        publish(tmp, path, overwrite=overwrite)
    except OSError as exc:
        if exc.errno in WRITE_ERRORS:
            raise disk_error(exc, path) from None
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def read_store(path: Path, kind: str | None = None) -> xr.Dataset:
    """Open a store fully into memory, checking that it is a gradscope store (of ``kind``)."""
    path = Path(path)
    if not path.is_dir():
        raise GradscopeError(f"store: {path} does not exist or is not a zarr store directory")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            ds = xr.open_zarr(path, consolidated=False, zarr_format=3).load()
    except Exception as exc:  # noqa: BLE001 - any failure to parse a user store is a user error
        raise GradscopeError(f"store: cannot read {path} as a zarr v3 store ({type(exc).__name__})") from None
    found = ds.attrs.get("kind")
    if found not in STORE_KINDS:
        raise GradscopeError(f"store: {path} is not a gradscope store (no known 'kind' attribute)")
    if kind is not None and found != kind:
        raise GradscopeError(f"store: {path} is a {found} store; expected a {kind} store")
    return ds


def attr_json(ds: xr.Dataset, key: str) -> Any:
    """A JSON-encoded attribute, decoded."""
    return json.loads(ds.attrs[key])
