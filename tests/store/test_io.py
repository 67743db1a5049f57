"""The store's one reader and writer (``read_store``, ``write_store``): real stores mutated as a careless or
a hostile user would (chunks deleted, truncated or swapped, metadata and attributes edited, files replaced
by directories, links or FIFOs), then read through `summarize` and `report`; stores that open in xarray
as they were written; writers racing for one path; a write killed midway, which leaves no half store; and
`--overwrite` of a folder that is not a store, which is refused.

Every mutation must end in exit 0 with the numbers of the unmutated input, or exit 2 with one
`error:` line; never a traceback, never a file changed or left behind. Counts per family are
printed at the end of the session (fuzzkit.count). The stores come from tests/store/conftest.py.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings, strategies as st

from tests.helpers.faultkit import Gate, fork_call, temporaries
from tests.helpers.fuzzkit import count, invoke
from tests.helpers.hardening import warm
from tests.helpers.storefuzz import HOSTILE_TEXT, JSON, SETTINGS, judge, replace_by
from tests.helpers.storekit import FAST, chunk_files, snapshot
from gradscope.errors import GradscopeError
from gradscope.store import read_store, write_store
from gradscope.store.summary import write_csv

NUMBERS = ("mean", "low", "high", "n", "nan", "nan_units", "values", "seed")


# ---- mutations ------------------------------------------------------------------------------------

SHAPES = st.sampled_from([[], [0], [-1], [1], [10**12], [2**63], [1, 2, 600_000_000], ["a"], [1.5], None, "2"])


def _json_file(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc))


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
        return replace_by(data, target, store)
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


# ---- what is written reads back, and one writer wins --------------------------------------------

@pytest.mark.parametrize("kind", ["accuracy", "stability", "dynamics", "summary"])
def test_every_store_opens_in_xarray_without_a_warning_and_reads_back_exactly(made: dict[str, Path],
                                                                              kind: str) -> None:
    """Caught before the fix: every xr.open_zarr(store) warned 'failed to open with consolidated metadata'."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opened = xr.open_zarr(made[kind]).load()
    ds = read_store(made[kind])
    assert "integrity" in opened.attrs and "integrity" not in ds.attrs
    for name, var in ds.variables.items():
        assert var.dtype.kind in "OUT" or np.array_equal(var.values, opened[name].values, equal_nan=True), name


def _race(n: int, work: object) -> list[BaseException | None]:
    """Run ``work(i)`` in n threads released at once; each one's exception (or None)."""
    gate, results = threading.Barrier(n), [None] * n

    def one(i: int) -> None:
        gate.wait()
        try:
            work(i)  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - recorded and judged below
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.filterwarnings("ignore:Consolidated metadata")  # threads race on the process-wide warning filters
def test_concurrent_writers_without_overwrite_exactly_one_wins(made: dict[str, Path], tmp_path: Path) -> None:
    ds = read_store(made["accuracy"])
    variants = [ds.assign(token_accuracy=ds["token_accuracy"] * 0 + i) for i in range(4)]
    for attempt in range(3):
        target = tmp_path / f"race-{attempt}.zarr"
        results = _race(4, lambda i: write_store(variants[i], target))
        winners = [i for i, r in enumerate(results) if r is None]
        assert len(winners) == 1, results
        assert all(isinstance(r, GradscopeError) and "already exists" in str(r) and "\n" not in str(r)
                   for r in results if r is not None)
        assert float(read_store(target)["token_accuracy"][0]) == winners[0]
    entries = None
    from gradscope.store.summary import trial_record
    from gradscope.workflows.summarize import group_records, summarize_groups
    record = trial_record(made["accuracy"])
    entries = summarize_groups(group_records([record], ("core",)), ("core",), ["token_accuracy"], resamples=10)
    csv = tmp_path / "race.csv"
    results = _race(4, lambda i: write_csv(entries[:1] * (i + 1), csv))
    winners = [i for i, r in enumerate(results) if r is None]
    assert len(winners) == 1 and len(csv.read_text().splitlines()) == winners[0] + 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _write_store_race(path: Path, rounds: int, threads: bool) -> None:
    from gradscope.errors import GradscopeError
    from gradscope.store.io import read_store, write_store

    def dataset(i: int) -> xr.Dataset:
        return xr.Dataset({"x": ("i", np.arange(20_000) * (i + 1))}, attrs={"kind": "dynamics", "writer": i})  # a kind without required variables

    for r in range(rounds):
        target = path.parent / f"{path.stem}-{r}.zarr"
        if threads:
            barrier, results = threading.Barrier(2), [None, None]

            def write(i: int) -> None:
                barrier.wait()
                try:
                    write_store(dataset(i), target)
                    results[i] = 0
                except GradscopeError:
                    results[i] = 2
                except BaseException as exc:  # noqa: BLE001
                    results[i] = exc

            workers = [threading.Thread(target=write, args=(i,)) for i in range(2)]
            [t.start() for t in workers]
            [t.join() for t in workers]
            codes = results
        else:
            gate = Gate()

            def write_child(i: int) -> Callable[[], None]:
                def call() -> None:
                    try:
                        write_store(dataset(i), target)
                    except GradscopeError as exc:
                        print(f"error: {exc}", file=__import__("sys").stderr)
                        raise SystemExit(2) from None
                return call

            children = [fork_call(write_child(i), cwd=path.parent, logs=path.parent / "logs", gate=gate) for i in range(2)]
            gate.open()
            codes = [c.wait() for c in children]
        assert sorted(map(str, codes)) == ["0", "2"], f"round {r} ({'threads' if threads else 'processes'}): {codes}"
        got = read_store(target)
        winner = codes.index(0)
        assert got.attrs["writer"] == winner and (got["x"].values == dataset(winner)["x"].values).all()
        assert not temporaries(path.parent), temporaries(path.parent)


def test_two_write_store_calls_on_one_path_at_once_one_wins(tmp_path: Path) -> None:
    warm()
    _write_store_race(tmp_path / "X.zarr", rounds=4, threads=False)
    _write_store_race(tmp_path / "T.zarr", rounds=4, threads=True)
    count("concurrent: write_store", 8)


def test_store_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = xr.Dataset({"x": ("a", np.arange(3))}, attrs={"kind": "stability"})
    write_store(good, tmp_path / "s.zarr")

    def explode(self: xr.Dataset, store: Path, **kwargs: object) -> None:
        (Path(store) / "zarr.json").write_text("{")  # a half-written store …
        raise KeyboardInterrupt  # … then the run is killed

    monkeypatch.setattr(xr.Dataset, "to_zarr", explode)
    with pytest.raises(KeyboardInterrupt):
        write_store(good, tmp_path / "s.zarr", overwrite=True)
    with pytest.raises(KeyboardInterrupt):
        write_store(good, tmp_path / "new.zarr")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]  # no half store, no temp dirs
    monkeypatch.undo()
    assert read_store(tmp_path / "s.zarr")["x"].values.tolist() == [0, 1, 2]


def test_overwrite_replaces_a_store_never_a_folder_of_other_files(tmp_path: Path) -> None:
    """Caught by a hostile pass: `-o FOLDER --overwrite` deleted a folder of the user's files (the store
    was renamed over it), and `-o ''` or `-o .` ended in a traceback after moving at the current
    directory. Now each is one line before any work, and nothing is touched."""
    import numpy as np
    import xarray as xr
    from typer.testing import CliRunner

    from gradscope.cli.app import app
    from gradscope.errors import GradscopeError
    from gradscope.store.io import is_store, write_store

    ds = xr.Dataset({"x": ("i", np.arange(3.0))}, attrs={"kind": "summary"})
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "precious.txt").write_text("keep")
    for target in (folder, Path("."), Path(""), tmp_path / ".."):
        with pytest.raises(GradscopeError, match="not a store|give the store a name"):
            write_store(ds, target, overwrite=True)
    assert (folder / "precious.txt").read_text() == "keep"
    empty = tmp_path / "empty"
    empty.mkdir()
    write_store(ds, empty, overwrite=True)  # an empty folder holds nothing to lose
    write_store(ds, empty, overwrite=True)  # and a store is replaced
    assert is_store(empty)
    # the command refuses it before any work (the checkpoint is not even read)
    done = CliRunner().invoke(app, ["accuracy", str(tmp_path / "none.pt"), "-o", str(folder), "--overwrite"])
    assert done.exit_code == 2 and "not a store" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in folder.iterdir()) == ["precious.txt"]
