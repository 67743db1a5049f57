"""A library model's weight files, read without loading a tensor (``models.adapters.weights``): a
truncated safetensors file, a header that lies about its length or alters a tensor's dtype or offset,
and shards that are not safetensors inside the directory are refused in one line. The saved tiny Mamba
and the helpers come from tests/models/adapters/test_load.py; nothing is downloaded."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from gradscope.errors import GradscopeError  # noqa: E402
from gradscope.models.adapters.load import load_hf  # noqa: E402
from tests.models.adapters.test_load import cli, refused, saved, weights  # noqa: E402,F401 - the fixture


@pytest.mark.parametrize("cut", [4, 100, -1])
def test_a_truncated_safetensors_file_is_one_line(saved: Path, runner, tmp_path: Path, cut: int) -> None:  # noqa: ANN001
    f = saved / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:cut] if cut > 0 else data[:cut])
    refused(cli(runner, saved, tmp_path), str(f))


def test_a_header_that_lies_about_its_length_is_refused(saved: Path) -> None:
    f = saved / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(struct.pack("<Q", 2**60) + data[8:])
    with pytest.raises(GradscopeError, match="header"):
        load_hf("hf", saved)


@pytest.mark.parametrize("shard", ["pytorch_model-00002-of-00002.bin", "../outside.safetensors", "sub/model.safetensors"])
def test_shards_are_safetensors_inside_the_directory(saved: Path, runner, tmp_path: Path, shard: str) -> None:  # noqa: ANN001
    """Half the weights in a safetensors shard, half in ``shard``: a pickle, or a file outside the directory."""
    state = weights(saved)
    names = sorted(state)
    first, second = {k: state[k] for k in names[::2]}, {k: state[k] for k in names[1::2]}
    safetensors_torch.save_file(first, str(saved / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    target = saved / shard
    target.parent.mkdir(parents=True, exist_ok=True)
    if shard.endswith(".bin"):
        torch.save(second, target)
    else:
        safetensors_torch.save_file(second, str(target), metadata={"format": "pt"})
    (saved / "model.safetensors").unlink()
    weight_map = {**{k: "model-00001-of-00002.safetensors" for k in first}, **{k: shard for k in second}}
    (saved / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    refused(cli(runner, saved, tmp_path), "model.safetensors.index.json", shard.split("/")[-1] if "/" not in shard
            else "")


def test_an_altered_dtype_or_offset_in_the_header_is_refused(saved: Path) -> None:
    f = saved / "model.safetensors"
    data = f.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [10**6] + header[name]["shape"][1:]
    raw = json.dumps(header).encode()
    f.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])
    with pytest.raises(GradscopeError, match=name.replace(".", r"\.")):
        load_hf("hf", saved)
