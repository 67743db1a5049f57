"""Property-based hardening of the store boundary (issue #15): real stores, run directories and a
sweep manifest, mutated as a careless or a hostile user would (chunks deleted, truncated or
swapped, metadata and attributes edited, files replaced by directories, links or FIFOs, run files
and manifests rewritten), then read through `summarize` and `report`.

Every mutation must end in exit 0 with the numbers of the unmutated input, or exit 2 with one
`error:` line; never a traceback, never a file changed or left behind. Counts per family are
printed at the end of the session (fuzzkit.count).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.fuzzkit import assert_clean, assert_untouched, count, invoke
from gradscope.store import read_store
from gradscope.store.inputs import load_run
from tests.helpers.storekit import FAST, built, chunk_files, snapshot

SETTINGS = dict(derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
NUMBERS = ("mean", "low", "high", "n", "nan", "nan_units", "values", "seed")


@pytest.fixture(scope="session")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The built inputs, and a legacy version of each store (see ``legacy``)."""
    out = dict(built(tmp_path_factory.mktemp("hardening-stores") / "base"))
    d = tmp_path_factory.mktemp("legacy")
    for kind in ("accuracy", "stability", "dynamics", "summary"):
        out[f"legacy-{kind}"] = legacy(out[kind], d / out[kind].name)
    return out


@pytest.fixture(scope="session")
def baseline(made: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the unmutated inputs read as: every store's values, each summary's numbers, the run's log."""
    out: dict[str, Any] = {"stores": {k: read_store(made[k]) for k in ("accuracy", "stability", "dynamics", "summary")},
                           "run": load_run(made["run"])}
    d = tmp_path_factory.mktemp("baseline")
    for kind in ("accuracy", "stability"):
        assert invoke(["summarize", made[kind], "-o", d / f"{kind}.zarr", *FAST]).rc == 0
        out[f"summary-{kind}"] = read_store(d / f"{kind}.zarr")
    return out


# ---- mutations ------------------------------------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, width=32)
                    | st.text(max_size=8), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c,
                                                                                              max_size=3),
                    max_leaves=6)
SHAPES = st.sampled_from([[], [0], [-1], [1], [10**12], [2**63], [1, 2, 600_000_000], ["a"], [1.5], None, "2"])
HOSTILE_TEXT = st.sampled_from(["{not json", "[" * 5000, "", "null", "[]", "{}", '{"core": 5}', "\u0000",
                                '{"seed": "x"}', '{"seed": 1e30}', '[{"path": 5}]', '["a", 1]', "NaN"])


def _json_file(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc))


def _replace_by(data: st.DataObject, path: Path, root: Path) -> str:
    """Replace ``path`` by a directory, a link (inside, outside, dangling, to /dev/zero) or a FIFO."""
    how = data.draw(st.sampled_from(["dir", "link-inside", "link-outside", "link-dangling", "link-zero", "fifo"]))
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    if how == "dir":
        path.mkdir()
    elif how == "fifo":
        os.mkfifo(path)
    else:
        target = {"link-inside": root / "zarr.json", "link-outside": Path(__file__),
                  "link-dangling": root / "nowhere", "link-zero": Path("/dev/zero")}[how]
        path.symlink_to(target)
    return f"replace {path.relative_to(root)} by {how}"


def legacy(store: Path, into: Path) -> Path:
    """``store`` as gradscope wrote stores before issue #15: no record of its values, no consolidated
    metadata (here with every chunk present: a legacy store that has none missing)."""
    import zarr
    with zarr.config.set({"array.write_empty_chunks": True}):
        read_store(store).to_zarr(into, zarr_format=3, consolidated=False)
    return into


def copy_store(data: st.DataObject, made: dict[str, Path], kind: str, tmp: str) -> tuple[Path, bool]:
    """A private copy of the ``kind`` store, half of the time its legacy version."""
    old = data.draw(st.booleans())
    store = Path(tmp) / made[kind].name
    shutil.copytree(made[f"legacy-{kind}"] if old else made[kind], store)
    return store, old


def mutate_store(data: st.DataObject, store: Path, old: bool) -> str:
    """One random mutation of a store on disk; returns what it did. A legacy store has no record of
    its values, so chunk bytes that decode to other numbers cannot be caught there: its mutations
    leave chunk contents alone."""
    ops = ["delete-chunk", "delete-variable", "array-meta", "root-attr", "replace", "root-bytes"]
    op = data.draw(st.sampled_from(ops if old else [*ops, "consolidated", "chunk-bytes"]))
    return f"{'legacy ' if old else ''}{_mutate(data, store, op)}"


def _mutate(data: st.DataObject, store: Path, op: str) -> str:
    variables = sorted(p.name for p in store.iterdir() if p.is_dir())
    if op == "delete-chunk":
        chunk = data.draw(st.sampled_from(chunk_files(store)))
        chunk.unlink()
        return f"delete chunk {chunk.relative_to(store)}"
    if op == "delete-variable":
        name = data.draw(st.sampled_from(variables))
        shutil.rmtree(store / name)
        return f"delete variable {name}"
    if op == "array-meta":
        name = data.draw(st.sampled_from(variables))
        meta_path = store / name / "zarr.json"
        meta = _json_file(meta_path)
        field = data.draw(st.sampled_from(["shape", "data_type", "fill_value", "chunk_shape", "dimension_names",
                                           "codecs", "attributes", "chunk_key_encoding", "node_type"]))
        if field == "shape":
            meta["shape"] = data.draw(SHAPES | st.just([s + 1 for s in meta["shape"]]))
        elif field == "chunk_shape":
            meta["chunk_grid"]["configuration"]["chunk_shape"] = data.draw(SHAPES)
        elif field == "data_type":
            meta["data_type"] = data.draw(st.sampled_from(["int8", "float32", "string", "bool", "complex128",
                                                           "datetime64", 5]))
        elif field == "fill_value":
            meta["fill_value"] = data.draw(st.sampled_from([0, 1, "NaN", "x", None, [1]]))
        elif field == "dimension_names":
            meta["dimension_names"] = data.draw(st.sampled_from([meta["dimension_names"][::-1], ["x"] *
                                                                 len(meta["shape"]), None, [1]]))
        elif field == "codecs":
            meta["codecs"] = data.draw(st.sampled_from([[], [{"name": "gzip"}], [{"name": "nope"}], "bytes",
                                                        [{"name": "zstd", "configuration": "x"}]]))
        elif field == "attributes":
            meta["attributes"] = data.draw(st.sampled_from([
                {"units": "days since 2000-01-01"}, {"scale_factor": 1e300}, {"coordinates": "nonexistent"},
                {"_FillValue": "AAAA"}, [], {"dtype": "bool"}]))
        else:
            meta[field] = data.draw(JSON)
        _write_json(meta_path, meta)
        return f"{name}/zarr.json {field} = {str(meta.get(field, meta.get('chunk_grid')))[:60]}"
    if op == "root-attr":
        root = _json_file(store / "zarr.json")
        key = data.draw(st.sampled_from(["kind", "model_config", "task_config", "train_config", "checkpoints",
                                         "options", "integrity", "by", "confidence", "unit"]))
        value = data.draw(JSON | HOSTILE_TEXT | st.sampled_from(["accuracy", "stability", "summary", "dynamics"]))
        root["attributes"][key] = value
        _write_json(store / "zarr.json", root)
        return f"attribute {key} = {str(value)[:60]!r}"
    if op == "consolidated":
        root = _json_file(store / "zarr.json")
        how = data.draw(st.sampled_from(["remove", "drop-entry", "edit-entry", "garbage"]))
        listed = root["consolidated_metadata"]["metadata"]
        name = data.draw(st.sampled_from(sorted(listed)))
        if how == "remove":
            del root["consolidated_metadata"]
        elif how == "drop-entry":
            del listed[name]
        elif how == "edit-entry":
            listed[name]["shape"] = [s + 1 for s in listed[name]["shape"]]
        else:
            root["consolidated_metadata"] = data.draw(JSON)
        _write_json(store / "zarr.json", root)
        return f"consolidated metadata: {how} {name}"
    if op == "chunk-bytes":
        chunk = data.draw(st.sampled_from(chunk_files(store)))
        raw = chunk.read_bytes()
        how = data.draw(st.sampled_from(["truncate", "flip", "append", "empty", "swap"]))
        if how == "truncate":
            raw = raw[:data.draw(st.integers(0, max(len(raw) - 1, 0)))]
        elif how == "flip":
            at = data.draw(st.integers(0, len(raw) - 1))
            raw = raw[:at] + bytes([raw[at] ^ 0xFF]) + raw[at + 1:]
        elif how == "append":
            raw += data.draw(st.binary(min_size=1, max_size=64))
        elif how == "empty":
            raw = b""
        else:
            raw = data.draw(st.sampled_from(chunk_files(store))).read_bytes()
        chunk.write_bytes(raw)
        return f"chunk {chunk.relative_to(store)}: {how}"
    if op == "replace":
        target = data.draw(st.sampled_from([store / "zarr.json", *(store / v for v in variables),
                                            *(store / v / "zarr.json" for v in variables), *chunk_files(store)]))
        return _replace_by(data, target, store)
    raw = data.draw(st.sampled_from([b"\xff\xfe", b"[" * 100_000, b"{", b"", b'{"zarr_format": 3}',
                                     b'{"zarr_format": 3, "node_type": "group", "attributes": []}']))
    (store / "zarr.json").write_bytes(raw)
    return f"root zarr.json = {raw[:20]!r}"


# ---- judging --------------------------------------------------------------------------------------

def _same_values(got: Any, want: Any, every: bool = True) -> None:
    """The variables of ``got`` (and, with ``every``, all of ``want``'s) with ``want``'s values
    (NaN equal to NaN). A legacy store may lose a variable no reader needs (an index coordinate)."""
    for name, var in want.variables.items():
        if name not in got.variables:
            assert not every, name
            continue
        a, b = got[name].values, var.values
        if b.dtype.kind in "fc":
            # bit for bit: a store read back (copies, no arithmetic)
            np.testing.assert_array_equal(a, b, err_msg=str(name))
        else:
            assert [str(x) for x in np.ravel(a)] == [str(x) for x in np.ravel(b)], name


def judge(outcome: Any, what: str, before: dict[str, str], after: dict[str, str], outputs: tuple[str, ...]) -> None:
    assert_clean(outcome, what)
    assert_untouched(before, after, new_ok=outputs if outcome.rc == 0 else ())


# ---- the tests ------------------------------------------------------------------------------------

@settings(max_examples=30, **SETTINGS)
@given(data=st.data())
def test_mutated_stores_through_summarize(made: dict[str, Path], baseline: dict[str, Any], data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["accuracy", "stability"]))
    with tempfile.TemporaryDirectory() as tmp:
        store, old = copy_store(data, made, kind, tmp)
        what = mutate_store(data, store, old)
        before = snapshot(tmp)
        outcome = invoke(["summarize", store, "-o", Path(tmp) / "s.zarr", *FAST])
        count(f"store via summarize (exit {outcome.rc})")
        judge(outcome, f"{kind}: {what}", before, snapshot(tmp), ("s.zarr",))
        if outcome.rc == 0:  # what was read is what was written
            summary = read_store(Path(tmp) / "s.zarr")
            _same_values(summary[[v for v in NUMBERS if v in summary]],
                         baseline[f"summary-{kind}"][[v for v in NUMBERS if v in summary]])
            _same_values(read_store(store), baseline["stores"][kind], every=False)


@settings(max_examples=15, **SETTINGS)
@given(data=st.data())
def test_mutated_stores_through_report(made: dict[str, Path], baseline: dict[str, Any], data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["summary", "dynamics", "stability", "accuracy"]))
    with tempfile.TemporaryDirectory() as tmp:
        store, old = copy_store(data, made, kind, tmp)
        what = mutate_store(data, store, old)
        before = snapshot(tmp)
        outcome = invoke(["report", store, "-o", Path(tmp) / "r.html", *FAST])
        count(f"store via report (exit {outcome.rc})")
        judge(outcome, f"{kind}: {what}", before, snapshot(tmp), ("r.html",))
        if outcome.rc == 0:
            _same_values(read_store(store), baseline["stores"][kind], every=False)


RUN_FILES = ("config.json", "metrics.jsonl", "eval.json")


@settings(max_examples=20, **SETTINGS)
@given(data=st.data())
def test_mutated_run_files_through_report(made: dict[str, Path], baseline: dict[str, Any],
                                          data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(made["run"], run)
        name = data.draw(st.sampled_from(RUN_FILES))
        path = run / name
        op = data.draw(st.sampled_from(["json", "bytes", "truncate", "append-line", "edit-field", "replace"]))
        if op == "json":
            path.write_text(json.dumps(data.draw(JSON)))
        elif op == "bytes":
            path.write_bytes(data.draw(st.binary(max_size=40) | st.sampled_from([b"\xff\xfe", b"[" * 100_000])))
        elif op == "truncate":
            raw = path.read_bytes()
            path.write_bytes(raw[:data.draw(st.integers(0, len(raw)))])
        elif op == "append-line":
            with open(path, "ab") as fh:
                fh.write(json.dumps(data.draw(JSON)).encode() + b"\n")
        elif op == "edit-field":  # one field, at the top or (config.json) inside the model/task/train configs
            lines = path.read_text().splitlines() if name == "metrics.jsonl" else [path.read_text()]
            doc = json.loads(lines[0])
            part = doc["config"][data.draw(st.sampled_from(["model", "task", "train"]))] \
                if name == "config.json" and data.draw(st.booleans()) else doc
            key = data.draw(st.sampled_from(sorted(part)))
            part[key] = data.draw(JSON | HOSTILE_TEXT)
            lines[0] = json.dumps(doc)
            path.write_text("\n".join(lines) + "\n")
        else:
            _replace_by(data, path, run)
        before = snapshot(tmp)
        outcome = invoke(["report", run, "-o", Path(tmp) / "r.html", *FAST])
        count(f"run files via report (exit {outcome.rc})")
        judge(outcome, f"{name}: {op}", before, snapshot(tmp), ("r.html",))
        if outcome.rc == 0 and name == "metrics.jsonl" and op == "truncate":  # a log cut short: a prefix of it
            logged = [json.dumps(r, sort_keys=True) for r in baseline["run"].metrics]
            assert all(json.dumps(r, sort_keys=True) in logged for r in load_run(run).metrics)


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


def test_overwrite_replaces_a_symlink_to_a_directory_not_its_target(tmp_path: Path) -> None:
    """`-o LINK --overwrite` where LINK points to a directory once ended in a NotADirectoryError
    traceback from the publish step (issue #24): the link is replaced, its target is left as it was."""
    import xarray as xr
    from gradscope.store.io import write_store
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("user data")
    link = tmp_path / "out.zarr"
    link.symlink_to(target, target_is_directory=True)
    ds = xr.Dataset({"x": ("i", np.arange(3.0))}, attrs={"kind": "test"})
    write_store(ds, link, overwrite=True)
    assert not link.is_symlink() and link.is_dir() and (link / "zarr.json").is_file()
    assert (target / "keep.txt").read_text() == "user data" and sorted(p.name for p in target.iterdir()) == ["keep.txt"]
