"""Zarr (v3) stores: atomic writes, checked reads, provenance attributes.

A store is written to a temporary sibling directory and renamed into place, so a killed run never
leaves a half-written store. An existing store is replaced only with ``overwrite=True``, and then
the old one is moved aside first and removed only after the new one is in place. Every chunk is
written (zarr skips all-fill chunks by default, which would make a deleted chunk undetectable),
with a record of every variable's shape, dtype and sha256 (``integrity`` attribute) and
consolidated metadata (so ``xr.open_zarr`` opens it without a warning).

Reading checks the store on disk before loading it and its values and layout after
(:mod:`gradscope.store.integrity`, :mod:`gradscope.store.schema`): whatever a reader gets back is a
store of the documented layout, holding the values it was written with.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import xarray as xr
import zarr

from gradscope.errors import GradscopeError
from gradscope.files.publish import OUT_LABEL, WRITE_ERRORS, disk_error, publish, remove_stale_temporaries, temp_path
from gradscope.store.integrity import RECORD, inspect_store, make_record, verify_record
from gradscope.store.schema import check_attrs, check_layout, check_summary_fields
from gradscope.version import __version__

STORE_KINDS = ("stability", "accuracy", "summary", "dynamics")


def provenance(kind: str, command: str, device: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Attributes every store carries. Nested values are JSON strings (portable zarr attributes)."""
    attrs: dict[str, Any] = {
        "kind": kind, "gradscope_version": __version__, "torch_version": str(torch.__version__),
        "device": device, "host": platform.node(), "command": command, "threads": torch.get_num_threads(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    for key, value in (extra or {}).items():
        attrs[key] = value if isinstance(value, (str, int, float, bool)) else json.dumps(value)
    return attrs


def check_store_target(path: Path, overwrite: bool, what: str = OUT_LABEL) -> None:
    """Refuse a path a store cannot be written to, before any work: no name (``''``, ``.``, ``..``),
    a missing parent directory, an existing path without ``overwrite``, a file, or a directory that
    is not a store and not empty (``overwrite`` replaces a store, never a folder of other files)."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise GradscopeError(f"{what}: got {str(path)!r}; give the store a name (e.g. results.zarr), not a folder "
                             f"such as the current directory")
    if not path.parent.is_dir():
        raise GradscopeError(f"{what}: directory {path.parent} does not exist")
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise GradscopeError(f"{what}: {path} already exists; choose another path or pass overwrite=True (--overwrite)")
    if path.exists() and not path.is_dir():
        raise GradscopeError(f"{what}: {path} is a file; a store is a directory, choose another path")
    if path.is_dir() and not path.is_symlink() and not is_store(path) and any(path.iterdir()):
        raise GradscopeError(f"{what}: {path} is a folder that is not a store; overwrite replaces a store, never a "
                             f"folder of other files: choose another path")


def write_store(ds: xr.Dataset, path: Path, overwrite: bool = False) -> Path:
    """Write ``ds`` to a zarr v3 store at ``path`` atomically (a temporary sibling, then a rename).

    Without ``overwrite`` an existing store is never replaced, even one that a concurrent writer
    renamed into place while this one was writing. Temporaries left by killed writers of the same
    store are removed first. Every chunk is written, the values' record (:data:`RECORD`) and
    consolidated metadata with them. A full disk or a file-size limit is a one-line user error
    that leaves ``path`` as it was."""
    path = Path(path)
    check_store_target(path, overwrite)
    remove_stale_temporaries(path.parent, path.name)
    ds = ds.copy(deep=False)
    ds.attrs = {**ds.attrs, RECORD: make_record(ds)}
    tmp = temp_path(path)
    try:
        os.mkdir(tmp)  # ours alone (a fresh name); the store is written into it
        with warnings.catch_warnings(), zarr.config.set({"array.write_empty_chunks": True}):
            # zarr notes that consolidated metadata is not in the v3 spec yet: written on purpose, so
            # that xr.open_zarr opens the store without a warning of its own
            warnings.filterwarnings("ignore", "Consolidated metadata is currently not part", UserWarning)
            ds.to_zarr(tmp, mode="w-", zarr_format=3, consolidated=True)
        publish(tmp, path, overwrite=overwrite)
    except OSError as exc:
        if exc.errno in WRITE_ERRORS:
            raise disk_error(exc, path) from None
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


# what zarr, numcodecs and xarray raise on a store whose chunks or metadata do not parse
READ_ERRORS = (ValueError, TypeError, KeyError, IndexError, RuntimeError, OSError, EOFError)


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


def read_store(path: Path, kind: str | None = None) -> xr.Dataset:
    """Open a store fully into memory, checking that it is a gradscope store (of ``kind``), intact
    (every chunk present, values as recorded, sizes within memory) and of its kind's layout."""
    path = Path(path)
    if not path.is_dir():
        raise GradscopeError(f"store: {path} does not exist or is not a zarr store directory")
    if not (path / "zarr.json").exists():
        raise GradscopeError(f"store: {path} is not a zarr store (it has no zarr.json)")
    meta = inspect_store(path)
    attrs, found = meta.attrs, meta.attrs.get("kind")
    if not isinstance(found, str) or found not in STORE_KINDS:
        raise GradscopeError(f"store: {path} is not a gradscope store (no known 'kind' attribute)")
    if kind is not None and found != kind:
        raise GradscopeError(f"store: {path} is a {found} store; expected a {kind} store")
    check_attrs(attrs, found, path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # decoding notes; the checks below judge what was read
            ds = xr.open_zarr(path, consolidated=False, zarr_format=3, chunks=None, mask_and_scale=False,
                              decode_times=False, decode_timedelta=False).load()
    except READ_ERRORS as exc:
        raise GradscopeError(f"store: cannot read {path} ({_reason(exc)})") from None
    record = ds.attrs.pop(RECORD, None)
    if record is None and meta.consolidated:  # gradscope consolidates only since it records values too
        raise GradscopeError(f"store: {path}: its '{RECORD}' record of values was removed; re-create the store")
    if record is not None:
        verify_record(ds, record, path)
    check_layout(ds, found, path)
    if found == "summary":
        check_summary_fields(ds, path)
    return ds


def is_store(path: Path) -> bool:
    """Whether ``path`` looks like a zarr store (a directory with a zarr.json); not yet checked."""
    return Path(path).is_dir() and (Path(path) / "zarr.json").exists()


def store_kind(path: Path) -> str | None:
    """The ``kind`` attribute of the store at ``path`` as its metadata says, without loading it
    (None if the metadata does not parse: reading the store will say why)."""
    try:
        doc = json.loads((Path(path) / "zarr.json").read_bytes()[:MAX_KIND_PROBE].decode("utf-8"))
        kind = doc["attributes"]["kind"]
    except (OSError, ValueError, RecursionError, KeyError, TypeError):
        return None
    return kind if isinstance(kind, str) else None


MAX_KIND_PROBE = 64 << 20


def folder_entries(folder: Path) -> list[Path]:
    """The visible entries of a folder, sorted (temporaries and other hidden names left out)."""
    return sorted(p for p in Path(folder).iterdir() if not p.name.startswith("."))


def attr_json(ds: xr.Dataset, key: str) -> Any:
    """A JSON-encoded attribute, decoded."""
    return json.loads(ds.attrs[key])
