"""A sweep's manifest (``store.manifest``) as `summarize` and `report` read it: mutated, or with odd outputs
(a list, a number, a path out of the sweep) or an unknown status, it ends in exit 0 having read only stores
inside the sweep, or in one `error:` line, exit 2. The sweep comes from tests/store/conftest.py.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.fuzzkit import count, invoke
from tests.helpers.storefuzz import JSON, SETTINGS, judge, refused
from tests.helpers.storekit import FAST, snapshot
from gradscope.store import read_store


@settings(max_examples=15, **SETTINGS)
@given(data=st.data())
def test_mutated_sweep_manifests(made: dict[str, Path], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "sweep"
        shutil.copytree(made["sweep"], sweep, symlinks=True)
        manifest = sweep / "sweep.json"
        doc = json.loads(manifest.read_text())
        where = data.draw(st.sampled_from(["output", "outputs", "status", "point", "points", "doc", "bytes"]))
        if where == "output":
            key = data.draw(st.sampled_from(["run", "accuracy", "stability", "other"]))
            doc["points"][0]["outputs"][key] = data.draw(JSON | st.sampled_from(
                ["../../..", "/etc", "/", "stores/../../x", "run/../stores/acc.zarr", ".", "stores", "run\x00"]))
        elif where == "outputs":
            doc["points"][0]["outputs"] = data.draw(JSON)
        elif where == "status":
            doc["points"][0]["status"] = data.draw(JSON | st.sampled_from(["done", "failed", "pending"]))
        elif where == "point":
            doc["points"][0] = data.draw(JSON)
        elif where == "points":
            doc["points"] = data.draw(JSON)
        elif where == "doc":
            doc = data.draw(JSON)
        if where == "bytes":
            manifest.write_bytes(data.draw(st.sampled_from([b"\xff", b"[" * 100_000, b"", b"{"])))
        else:
            manifest.write_text(json.dumps(doc))
        command = data.draw(st.sampled_from(["summarize", "report"]))
        out = Path(tmp) / ("s.zarr" if command == "summarize" else "r.html")
        before = snapshot(tmp)
        outcome = invoke([command, sweep, "-o", out, *FAST])
        count(f"sweep manifests (exit {outcome.rc})")
        judge(outcome, f"{where}: {str(doc)[:200]}", before, snapshot(tmp), (out.name, "s-"))
        if outcome.rc == 0 and command == "summarize":  # only stores inside the sweep were read
            for summary in Path(tmp).glob("s*.zarr"):
                for source in json.loads(read_store(summary).attrs["sources"]):
                    assert Path(source).resolve().is_relative_to(sweep.resolve()), source


MANIFEST_CASES = [
    (["run"], "outputs"),
    ({"run": 5}, "outputs"),
    ({"run": "../../../etc"}, "outside"),
    ({"accuracy": "/etc"}, "outside"),
    ({"run": "run\x00x"}, "relative path"),
]


@pytest.mark.parametrize("outputs,needle", MANIFEST_CASES)
def test_odd_sweep_outputs_give_one_line(mine: dict[str, Path], tmp_path: Path, outputs: object,
                                         needle: str) -> None:
    """Caught before the fix: outputs that are a list → AttributeError; a path out of the sweep → read
    (and, here, a TypeError), exit 1."""
    manifest = mine["sweep"] / "sweep.json"
    doc = json.loads(manifest.read_text())
    doc["points"][0]["outputs"] = outputs
    manifest.write_text(json.dumps(doc))
    refused(["report", mine["sweep"], "-o", tmp_path / "r.html"], needle)
    refused(["summarize", mine["sweep"], "-o", tmp_path / "s.zarr"], needle)


def test_an_unknown_point_status_and_a_sweep_json_that_is_not_utf8(mine: dict[str, Path], tmp_path: Path) -> None:
    manifest = mine["sweep"] / "sweep.json"
    doc = json.loads(manifest.read_text())
    doc["points"][0]["status"] = ["done"]
    manifest.write_text(json.dumps(doc))
    refused(["report", mine["sweep"], "-o", tmp_path / "r.html"], "status")
    manifest.write_bytes(b"\xff" + manifest.read_bytes())
    refused(["summarize", mine["sweep"], "-o", tmp_path / "s.zarr"], "not UTF-8")
