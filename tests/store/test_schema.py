"""What a store must hold for its kind (``store.schema``): a malformed store (a coordinate deleted, an
attribute that is not JSON, dimensions swapped, metadata that is not UTF-8) is one line in `summarize`
and `report`, never a traceback. The stores come from tests/store/conftest.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.helpers.storefuzz import old_style, refused


def _edit_root(store: Path, **attrs: object) -> None:
    meta = json.loads((store / "zarr.json").read_text())
    meta["attributes"].update(attrs)
    (store / "zarr.json").write_text(json.dumps(meta))


def test_malformed_stores_give_one_line(mine: dict[str, Path], tmp_path: Path) -> None:
    """Caught before the fix: a deleted `condition` coordinate ended in KeyError (exit 1) in summarize
    and report; a model_config that is not JSON ended in JSONDecodeError (exit 1) in report."""
    acc, out = mine["accuracy"], tmp_path / "s.zarr"
    old = old_style(mine["stability"], tmp_path / "old.zarr")
    shutil.rmtree(old / "condition")
    for args in (["summarize", old, "-o", out], ["report", old, "-o", tmp_path / "r.html"]):
        refused(args, "condition")
    shutil.rmtree(mine["stability"] / "condition")
    refused(["report", mine["stability"], "-o", tmp_path / "r.html"], "condition")
    _edit_root(acc, model_config="{not json")
    for args in (["summarize", acc, "-o", out], ["report", acc, "-o", tmp_path / "r.html"]):
        refused(args, "model_config")
    old = old_style(mine["dynamics"], tmp_path / "old-dyn.zarr")
    meta = json.loads((old / "flow_fro" / "zarr.json").read_text())
    meta["dimension_names"] = meta["dimension_names"][::-1]
    (old / "flow_fro" / "zarr.json").write_text(json.dumps(meta))
    refused(["report", old, "-o", tmp_path / "r.html"], "flow_fro")
    (mine["summary"] / "zarr.json").write_bytes(b"\xff\xfe garbage")
    refused(["report", mine["summary"], "-o", tmp_path / "r.html"], "not UTF-8")
    assert not out.exists() and not (tmp_path / "r.html").exists()
