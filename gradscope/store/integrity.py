"""A store on disk, checked before it is loaded and after: no fill value passes as data.

Before loading, :func:`inspect_store` reads the metadata itself (bounded, UTF-8, JSON objects) and
checks every array: its shape, data type, chunk grid and dimension names; that every chunk file the
metadata implies is present, a plain file inside the store (zarr would silently read a deleted
chunk as its fill value); that the memory its declared shape needs fits the budget and is plausible
for the bytes on disk (:func:`gradscope.guard.check_bytes`); and that consolidated metadata, where
present, agrees with the arrays' own.

After loading, :func:`verify_record` compares every variable with the record written beside it
(``integrity`` attribute: shape, dtype and sha256 of the values), so a chunk replaced or edited on
disk is refused too. Stores written before the record existed are read without that last check.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from gradscope.errors import GradscopeError
from gradscope.guard import check_bytes, inside

RECORD = "integrity"  # the root attribute holding the record
RECORD_VERSION = 1
MAX_ROOT_JSON = 64 << 20  # bytes of a root zarr.json (its attributes hold the configs and checkpoint list)
MAX_ARRAY_JSON = 1 << 20
MAX_CHUNKS = 100_000  # per store; zarr's automatic chunking of any store gradscope writes stays far below
ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
            "uint64": 8, "float16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16,
            "string": 16}  # a string costs at least numpy's StringDType slot
CODECS = {"bytes", "zstd", "gzip", "blosc", "crc32c", "vlen-utf8", "vlen-bytes", "transpose"}


@dataclass(frozen=True)
class ArrayMeta:
    """One array as its metadata declares it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    dims: tuple[str, ...]
    chunks: int
    nbytes: int
    chunk_nbytes: int


def _load_json(path: Path, limit: int, what: str) -> Any:
    if path.is_symlink() or not path.is_file():
        raise GradscopeError(f"{what}: {path} is missing or not a plain file")
    size = path.stat().st_size
    if size > limit:
        raise GradscopeError(f"{what}: {path} is {size} bytes; metadata this large is not a gradscope store's")
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise GradscopeError(f"{what}: {path} is not UTF-8 text") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        reason = str(exc) if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise GradscopeError(f"{what}: {path} is not valid JSON ({reason})") from None
    except OSError as exc:
        raise GradscopeError(f"{what}: cannot read {path} ({exc.strerror or type(exc).__name__})") from None


def _ints(value: Any, low: int) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= low
                                              for v in value):
        return None
    return tuple(value)


def _array_meta(name: str, meta: Any, what: str) -> ArrayMeta:
    """The declared layout of one array, every field checked (a user error names the first bad one)."""
    bad = lambda field, expected: GradscopeError(  # noqa: E731
        f"{what}: variable {name!r} has {field} {str(meta.get(field) if isinstance(meta, dict) else meta)[:60]!r} "
        f"in its zarr.json; expected {expected}")
    if not isinstance(meta, dict) or meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        raise GradscopeError(f"{what}: variable {name!r}: its zarr.json is not zarr v3 array metadata")
    shape = _ints(meta.get("shape"), 0)
    if shape is None:
        raise bad("shape", "a list of non-negative integers")
    dtype = meta.get("data_type")
    if dtype not in ITEMSIZE:
        raise bad("data_type", f"one of {', '.join(ITEMSIZE)}")
    grid = meta.get("chunk_grid")
    chunk = _ints(grid.get("configuration", {}).get("chunk_shape"), 1) \
        if isinstance(grid, dict) and grid.get("name") == "regular" and isinstance(grid.get("configuration"), dict) \
        else None
    if chunk is None or len(chunk) != len(shape):
        raise bad("chunk_grid", f"a regular grid of {len(shape)} positive chunk sizes")
    dims = meta.get("dimension_names")
    if not isinstance(dims, list) or len(dims) != len(shape) or not all(isinstance(d, str) and d for d in dims):
        raise bad("dimension_names", f"{len(shape)} names")
    codecs = meta.get("codecs")
    if not isinstance(codecs, list) or not all(isinstance(c, dict) and c.get("name") in CODECS for c in codecs):
        raise bad("codecs", f"codecs among {', '.join(sorted(CODECS))}")
    if not isinstance(meta.get("attributes", {}), dict):
        raise bad("attributes", "an object")
    n = math.prod(shape)
    chunks = math.prod(-(-s // c) for s, c in zip(shape, chunk)) if n else 0
    size = ITEMSIZE[dtype]
    return ArrayMeta(name, shape, dtype, tuple(dims), chunks, n * size, math.prod(chunk) * size)


def _chunk_keys(meta: dict[str, Any], array: ArrayMeta, what: str) -> list[str]:
    """Relative paths of every chunk of ``array`` (zarr v3 'default' or 'v2' chunk key encoding)."""
    enc = meta.get("chunk_key_encoding", {"name": "default"})
    name = enc.get("name") if isinstance(enc, dict) else None
    config = enc.get("configuration", {}) if isinstance(enc, dict) else {}
    sep = config.get("separator", "/" if name == "default" else ".") if isinstance(config, dict) else None
    if name not in ("default", "v2") or sep not in ("/", "."):
        raise GradscopeError(f"{what}: variable {array.name!r} has an unknown chunk_key_encoding "
                             f"{str(enc)[:60]!r}")
    chunk = meta["chunk_grid"]["configuration"]["chunk_shape"]
    counts = [-(-s // c) for s, c in zip(array.shape, chunk)]
    keys = []
    for index in np.ndindex(*counts):
        parts = [str(i) for i in index]
        keys.append(sep.join((["c"] if name == "default" else []) + parts) or "0")
    return keys


@dataclass(frozen=True)
class Inspected:
    """What a store's metadata says: its root attributes, its arrays, whether it is consolidated."""

    attrs: dict[str, Any]
    arrays: dict[str, ArrayMeta]
    consolidated: bool


def inspect_store(path: Path) -> Inspected:
    """The root attributes and every array of the store at ``path``, checked on disk before loading:
    metadata, chunk files present and inside the store, declared size against memory and bytes on
    disk, consolidated metadata consistent. Raises :class:`GradscopeError` on the first problem."""
    what = f"store: {path}"
    root = _load_json(path / "zarr.json", MAX_ROOT_JSON, what)
    if not isinstance(root, dict) or root.get("zarr_format") != 3 or root.get("node_type") != "group":
        raise GradscopeError(f"{what}: its zarr.json is not zarr v3 group metadata")
    attrs = root.get("attributes", {})
    if not isinstance(attrs, dict):
        raise GradscopeError(f"{what}: its attributes are not a JSON object")
    arrays: dict[str, ArrayMeta] = {}
    metas: dict[str, Any] = {}
    total = chunk_max = present = n_chunks = 0
    for child in sorted(path.iterdir()):
        if not (child / "zarr.json").exists() and not (child / "zarr.json").is_symlink():
            continue  # not a node: zarr ignores it too
        rel = child.name
        node = inside(path, rel, what)
        if child.is_symlink() or not node.is_dir():
            raise GradscopeError(f"{what}: {rel} is not a directory inside the store")
        meta = _load_json(node / "zarr.json", MAX_ARRAY_JSON, what)
        if isinstance(meta, dict) and meta.get("node_type") == "group":
            continue  # a sub-group: xarray does not read it
        array = _array_meta(rel, meta, what)
        arrays[rel], metas[rel] = array, meta
        total += array.nbytes
        chunk_max = max(chunk_max, array.chunk_nbytes)
        n_chunks += array.chunks
    check_bytes(total + chunk_max, what)
    if n_chunks > MAX_CHUNKS:
        raise GradscopeError(f"{what}: its metadata declares {n_chunks} chunks; a gradscope store has at most "
                             f"{MAX_CHUNKS}")
    for rel, array in arrays.items():
        for key in _chunk_keys(metas[rel], array, what):
            chunk = path / rel / key
            if not chunk.exists() and not chunk.is_symlink():
                raise GradscopeError(f"{what}: variable {rel!r} lacks its chunk {key}: deleted, or (in a store "
                                     f"written before gradscope recorded its values) skipped by zarr for holding "
                                     f"only its fill value. Its fill value is not data; re-create the store")
            full = inside(path, f"{rel}/{key}", what)
            if chunk.is_symlink() or not full.is_file():
                raise GradscopeError(f"{what}: chunk {rel}/{key} is not a plain file")
            present += full.stat().st_size
    check_bytes(total + chunk_max, what, present=present)
    consolidated = root.get("consolidated_metadata")
    if consolidated is not None:
        listed = consolidated.get("metadata") if isinstance(consolidated, dict) else None
        if not isinstance(listed, dict):
            raise GradscopeError(f"{what}: its consolidated metadata is not a JSON object")
        arrays_listed = {k: v for k, v in listed.items() if not (isinstance(v, dict) and v.get("node_type") == "group")}
        if arrays_listed != metas:
            differ = sorted(set(arrays_listed) ^ set(metas)) or \
                sorted(k for k in metas if arrays_listed.get(k) != metas[k])
            raise GradscopeError(f"{what}: its consolidated metadata disagrees with its arrays "
                                 f"({', '.join(differ[:3])}); the store was edited after it was written. Re-create it")
    return Inspected(attrs, arrays, consolidated is not None)


# ---- the record of values -----------------------------------------------------------------------

def digest(values: np.ndarray) -> tuple[str, str]:
    """(dtype name, sha256) of an array's values: numbers by their little-endian bytes, strings by
    their UTF-8 text (object and StringDType arrays alike)."""
    a = np.asarray(values)
    if a.dtype.kind in "OUST":
        text = json.dumps([str(v) for v in a.ravel().tolist()], ensure_ascii=False)
        return "str", hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.dtype.name, hashlib.sha256(a.tobytes()).hexdigest()


def make_record(ds: xr.Dataset) -> str:
    """The record of every variable of ``ds`` (coordinates included), as the JSON attribute to store."""
    variables = {}
    for name, var in ds.variables.items():
        dtype, sha = digest(var.values)
        variables[str(name)] = {"shape": list(var.shape), "dtype": dtype, "sha256": sha}
    return json.dumps({"version": RECORD_VERSION, "variables": variables}, sort_keys=True)


def verify_record(ds: xr.Dataset, record: Any, path: Path) -> None:
    """Refuse ``ds`` unless its variables are exactly the recorded ones, with the recorded shapes,
    dtypes and values."""
    what = f"store: {path}"
    try:
        doc = json.loads(record) if isinstance(record, str) else None
    except (json.JSONDecodeError, RecursionError):
        doc = None
    variables = doc.get("variables") if isinstance(doc, dict) and doc.get("version") == RECORD_VERSION else None
    if not isinstance(variables, dict) or not all(isinstance(v, dict) for v in variables.values()):
        raise GradscopeError(f"{what}: its '{RECORD}' attribute is not a record gradscope wrote")
    present = {str(k) for k in ds.variables}
    if present != set(variables):
        missing, extra = sorted(set(variables) - present), sorted(present - set(variables))
        differ = [f"lacks {', '.join(missing[:4])}"] * bool(missing) + \
            [f"has extra {', '.join(extra[:4])}"] * bool(extra)
        raise GradscopeError(f"{what}: its variables differ from those it was written with ({'; '.join(differ)}); "
                             f"re-create it")
    for name, var in ds.variables.items():
        want = variables[str(name)]
        dtype, sha = digest(var.values)
        if [*var.shape] != want.get("shape") or dtype != want.get("dtype") or sha != want.get("sha256"):
            raise GradscopeError(f"{what}: the values of {name!r} differ from those it was written with "
                                 f"(a chunk edited, replaced or corrupted on disk); re-create it")
