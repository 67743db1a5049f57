"""A store's record of its values and its sizes (``store.integrity``): a deleted chunk is refused, never read
as its fill value; a chunk replaced by other valid values is refused; a legacy store (no record) is read, and
its deleted chunks found; a store whose metadata declares gigabytes is refused before anything is loaded.
Each test failed before its fix (the case it caught is in its docstring). The stores come from
tests/store/conftest.py.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import xarray as xr

from tests.helpers.storefuzz import old_style, refused
from tests.helpers.storekit import FAST, chunk_files
from gradscope.errors import GradscopeError
from gradscope.store import read_store


# ---- no fill value passes as data ------------------------------------------------------------------

@pytest.mark.parametrize("kind,variable", [("accuracy", "sequence_correct"), ("accuracy", "token_accuracy"),
                                           ("stability", "score_default"), ("stability", "condition"),
                                           ("summary", "mean"), ("dynamics", "flow_fro")])
def test_a_deleted_chunk_is_refused_not_read_as_its_fill_value(mine: dict[str, Path], tmp_path: Path, kind: str,
                                                               variable: str) -> None:
    """Caught before the fix: with sequence_correct's chunk deleted, `summarize --unit token` printed
    token_accuracy 0.000 [0.000, 0.000] for a true 0.316, and exited 0."""
    store = mine[kind]
    for chunk in (store / variable / "c").rglob("*"):
        if chunk.is_file():
            chunk.unlink()
    command = ["summarize", store, "-o", tmp_path / "s.zarr", "--unit", "token", *FAST] \
        if kind in ("accuracy", "stability") else ["report", store, "-o", tmp_path / "r.html"]
    refused(command, variable, "lacks its chunk")
    assert not (tmp_path / "s.zarr").exists() and not (tmp_path / "r.html").exists()


def test_a_store_written_before_the_record_is_read_and_its_deleted_chunks_found(mine: dict[str, Path],
                                                                               tmp_path: Path) -> None:
    old = old_style(mine["accuracy"], tmp_path / "old.zarr")
    assert "integrity" not in json.loads((old / "zarr.json").read_text())["attributes"]
    xr.testing.assert_identical(read_store(old), read_store(mine["accuracy"]))
    next(p for p in chunk_files(old) if "sequence_correct" in p.parts).unlink()
    with pytest.raises(GradscopeError, match="sequence_correct.*lacks its chunk"):
        read_store(old)
    # zarr skipped the all-zero chunk of `checkpoint` (one checkpoint: index 0): it cannot be told
    # from a deleted one, so it is refused too
    with pytest.raises(GradscopeError, match="'checkpoint' lacks its chunk .*fill value is not data"):
        read_store(old_style(mine["accuracy"], tmp_path / "skipped.zarr", skip_empty=True))


def test_a_chunk_replaced_by_other_valid_values_is_refused(mine: dict[str, Path]) -> None:
    """A chunk that decodes fine but holds other values (fro_a's bytes in score_default's place)."""
    store = mine["stability"]
    src = sorted((store / "fro_a" / "c").rglob("*"))[-1]
    dst = store / "score_default" / src.relative_to(store / "fro_a")
    shutil.copyfile(src, dst)
    with pytest.raises(GradscopeError, match="values of 'score_default' differ"):
        read_store(store)


# ---- sizes checked before loading ------------------------------------------------------------------

@pytest.mark.parametrize("field", ["shape", "chunk_shape"])
def test_a_store_declaring_gigabytes_is_refused_before_loading(mine: dict[str, Path], tmp_path: Path,
                                                               field: str) -> None:
    """A 5 kB store whose metadata declares a 9.6 GB variable (shape), or 8 GB chunks."""
    meta_path = mine["stability"] / "score_default" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    if field == "shape":
        meta["shape"] = [1, 2, 600_000_000]
        meta["chunk_grid"]["configuration"]["chunk_shape"] = [1, 2, 600_000_000]
    else:
        meta["chunk_grid"]["configuration"]["chunk_shape"] = [1, 2, 500_000_000]
    meta_path.write_text(json.dumps(meta))
    tic = time.perf_counter()
    err = refused(["summarize", mine["stability"], "-o", tmp_path / "s.zarr"], "store:")
    assert "of memory" in err or "decompression bomb" in err
    assert time.perf_counter() - tic < 10
