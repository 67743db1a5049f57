"""What a library model's weight files hold, read without loading a tensor.

- :func:`safetensors_header`: the names, dtypes and shapes of a ``.safetensors`` file, from its
  8-byte length and JSON header (at most :data:`MAX_HEADER` bytes), every tensor's byte range checked
  against its dtype, shape and the file's size: a truncated, padded or altered file is refused here,
  before anything is allocated.
- :func:`weight_files`: the ``.safetensors`` files of a ``save_pretrained`` directory, one file or the
  shards its ``model.safetensors.index.json`` names; safetensors only, every shard a plain file name
  in the directory (no separator, no '..').
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import torch

from gradscope.errors import GradscopeError, check
from gradscope.guard import safe_component

MAX_HEADER = 100 << 20  # bytes of a safetensors JSON header (safetensors itself allows 100 MB)
MAX_JSON = 64 << 20  # bytes of a config.json or a shard index
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U64": torch.uint64,
    "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class TensorInfo(NamedTuple):
    """One tensor of a weights file: its dtype, its shape and the file that holds it."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    file: Path


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path`` (at most :data:`MAX_JSON` bytes; nesting deeper than the parser
    allows is refused in one line, as is anything but an object)."""
    check(path.is_file(), f"{what}: {path} does not exist")
    size = path.stat().st_size
    check(size <= MAX_JSON, f"{what}: {path} is {size} bytes; a config.json or index of more than {MAX_JSON >> 20} MB is refused")
    try:
        data = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise GradscopeError(f"{what}: {path} is not JSON ({type(exc).__name__})") from None
    check(isinstance(data, dict), f"{what}: {path} holds {type(data).__name__}; expected a JSON object")
    return data


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62


def safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """name → (dtype, shape, path) of every tensor in the safetensors file ``path``, from its header
    alone; the tensors' byte ranges must tile the data section exactly, as the format requires."""
    what = f"checkpoint: {path}"
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        check(len(head) == 8, f"{what} is not a safetensors file: {size} bytes, shorter than its header length")
        n = int.from_bytes(head, "little")
        check(n <= MAX_HEADER, f"{what} declares a {n}-byte header; more than {MAX_HEADER >> 20} MB is refused")
        check(8 + n <= size, f"{what} is truncated: its header needs {8 + n} bytes, the file has {size}")
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise GradscopeError(f"{what} is not a safetensors file: its header is not JSON ({type(exc).__name__})") from None
    check(isinstance(header, dict), f"{what} is not a safetensors file: its header is not a JSON object")
    out: dict[str, TensorInfo] = {}
    ranges = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        ok = (isinstance(entry, dict) and entry.get("dtype") in DTYPES and isinstance(entry.get("shape"), list)
              and all(_int(s) for s in entry["shape"]) and isinstance(entry.get("data_offsets"), list)
              and len(entry["data_offsets"]) == 2 and all(_int(o) for o in entry["data_offsets"]))
        check(ok, f"{what}: tensor {name[:80]!r} has no valid dtype ({', '.join(DTYPES)}), shape and data_offsets")
        dtype, shape = DTYPES[entry["dtype"]], tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        numel = 1
        for s in shape:
            numel *= s
        check(end - begin == numel * dtype.itemsize,
              f"{what}: tensor {name} of shape {shape} ({entry['dtype']}) spans {end - begin} bytes; it needs "
              f"{numel * dtype.itemsize}")
        ranges.append((begin, end))
        out[name] = TensorInfo(dtype, shape, path)
    data = size - 8 - n
    pos = 0
    for begin, end in sorted(ranges):
        check(begin == pos, f"{what}: its tensors' byte ranges overlap or leave gaps at byte {pos}")
        pos = end
    check(pos == data, f"{what} is {'truncated' if pos > data else 'padded'}: its tensors need {pos} bytes of "
                       f"data, the file has {data}")
    return out


def weight_files(directory: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files of a ``save_pretrained`` directory: ``model.safetensors``, or the shards
    ``model.safetensors.index.json`` maps every weight to (each a ``.safetensors`` file in ``directory``),
    and that map (None for one file)."""
    index, single = directory / INDEX, directory / SINGLE
    if index.exists():
        data = read_json(index, "checkpoint")
        check(isinstance(data.get("weight_map"), dict) and bool(data["weight_map"]),
              f"checkpoint: {index} has no weight_map of tensor names to shard files")
        files = []
        for name in dict.fromkeys(data["weight_map"].values()):
            safe_component(name, f"checkpoint: {index} names a shard")
            check(name.endswith(".safetensors"), f"checkpoint: {index} names the shard {name!r}; gradscope loads "
                                                  f"safetensors only, never a pickle")
            path = directory / name  # a plain name: in the directory (a link there, as in a hub cache, is the user's)
            check(path.is_file(), f"checkpoint: {index} names the shard {name}, which is not a file in {directory}")
            files.append(path)
        return files, {str(k): v for k, v in data["weight_map"].items()}
    check(single.is_file(), f"checkpoint: {directory} has neither {SINGLE} nor {INDEX} (what save_pretrained "
                            f"writes); gradscope loads no pickled weights from a directory")
    return [single], None


def read_headers(files: list[Path], weight_map: dict[str, str] | None = None) -> dict[str, TensorInfo]:
    """The tensors of all ``files`` (shards): a name in two shards, or (given the index's
    ``weight_map``) in another shard than the index says, or missing from it, is refused."""
    out: dict[str, TensorInfo] = {}
    for f in files:
        for name, info in safetensors_header(f).items():
            check(name not in out, f"checkpoint: tensor {name} is in both {out[name].file.name if name in out else ''} "
                                   f"and {f.name}")
            out[name] = info
    if weight_map is not None:
        for name, shard in weight_map.items():
            check(name in out and out[name].file.name == shard,
                  f"checkpoint: {INDEX} puts tensor {name[:80]} in {shard}, which does not hold it")
        extra = sorted(set(out) - set(weight_map))
        check(not extra, f"checkpoint: {INDEX} does not list tensor {extra[0] if extra else ''} of {out[extra[0]].file.name if extra else ''}")
    return out


__all__ = ["DTYPES", "MAX_HEADER", "TensorInfo", "read_headers", "read_json", "safetensors_header", "weight_files"]
