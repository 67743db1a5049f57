"""The store boundary, case by case (issue #15, classes 1–6 for stores, summaries, reports and
accuracy): one regression test per class, each of which failed before its fix (the case it caught
is in its docstring).
"""

from __future__ import annotations

import errno
import json
import resource
import shutil
import signal
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from tests.helpers.fuzzkit import assert_clean, assert_untouched, count, invoke
from gradscope.errors import GradscopeError
from gradscope.store import read_store, write_store
from gradscope.store.records import AccuracyResult
from gradscope.store.summary import write_csv
from tests.helpers.storekit import FAST, built, chunk_files, fresh, snapshot


@pytest.fixture(scope="session")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return built(tmp_path_factory.mktemp("hardening-stores") / "base")


@pytest.fixture
def mine(made: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    return fresh(made["run"].parent, tmp_path / "in")


def refused(args: list[object], *needles: str) -> str:
    """Run a command that must end with one 'error:' line (exit 2) naming every needle."""
    outcome = invoke(args)
    assert_clean(outcome, str(args))
    assert outcome.rc == 2, f"{args} ended with exit 0:\n{outcome.out[-1500:]}"
    for needle in needles:
        assert needle in outcome.err, outcome.err
    return outcome.err


def row(out: str, metric: str) -> list[str]:
    """The cells of the summary table's row for ``metric``."""
    lines = [ln for ln in out.splitlines() if f" {metric} " in ln]
    assert len(lines) == 1, out
    return [c.strip() for c in lines[0].strip().strip("│").split("│")]


def old_style(store: Path, into: Path, skip_empty: bool = False) -> Path:
    """``store`` rewritten as gradscope wrote stores before issue #15: no record, no consolidated
    metadata; with ``skip_empty`` zarr's default of skipping chunks that hold only the fill value
    (else a store that happened to have none)."""
    import zarr
    ds = read_store(store)
    with warnings.catch_warnings(), zarr.config.set({"array.write_empty_chunks": not skip_empty}):
        warnings.simplefilter("ignore")
        ds.to_zarr(into, mode="w-", zarr_format=3, consolidated=False)
    return into


# ---- class 1: no fill value passes as data --------------------------------------------------------

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


# ---- class 2: NaN counted in summaries ------------------------------------------------------------

def test_nan_scores_are_counted_in_the_table_csv_store_and_report(made: dict[str, Path], tmp_path: Path) -> None:
    """Caught before the fix: the store's first triplet is NaN in both pairs; summarize printed the
    mean of the others with n = 1 and NaN 0 everywhere (table, CSV and store)."""
    ds = read_store(made["nan"])
    cond = str(ds["condition"].values[0])
    out, csv = tmp_path / "s.zarr", tmp_path / "s.csv"
    outcome = invoke(["summarize", made["nan"], "-o", out, "--csv", csv, "--metric", "all", *FAST])
    assert outcome.rc == 0, outcome.err
    for pair in ("same-target", "same-suffix"):
        metric = f"stability/{pair}/{cond}"
        scores = ds["score_default"].sel(pair=pair).values[-1][ds["condition"].values == cond]
        cells = row(outcome.out, metric)
        assert cells[3] == "1 (1 NaN triplet)", cells
        assert cells[2].startswith(f"{np.nanmean(scores):.3f}")
        line = next(ln for ln in csv.read_text().splitlines() if f",{metric}," in ln)
        assert line.split(",")[5:8] == ["1", "0", "1"], line  # n, nan (trials), nan_units
        summary = read_store(out)
        assert int(summary["nan_units"].sel(metric=metric)[0]) == 1
    for other in {str(c) for c in ds["condition"].values} - {cond}:
        assert row(outcome.out, f"stability/same-target/{other}")[3] == "1"
    page = tmp_path / "r.html"
    assert invoke(["report", made["nan"], "-o", page, *FAST]).rc == 0
    assert "+1 NaN, left out" in page.read_text()  # the curve's point and the box's points say so


# ---- class 3: sizes checked before loading --------------------------------------------------------

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


# ---- class 4: malformed stores, run files and manifests: one line ---------------------------------

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


RUN_FILES = [
    ("config.json", b"\xff\xfe{}", "not UTF-8"),
    ("config.json", b"[1, 2]", "not a gradscope run config"),
    ("config.json", b'{"format": "gradscope-run", "config": {"model": [], "task": {}, "train": {}}}', "config"),
    ("config.json", b'{"format": "gradscope-run", "config": {"train": {"seed": "x"}}}', "seed"),
    ("config.json", b"[" * 100_000, "JSON"),
    ("metrics.jsonl", b'{"iteration": 5, "loss": 1.0}\n[1, 2]\n', "metrics.jsonl line 2"),
    ("metrics.jsonl", b'{"iteration": "5"}\n', "metrics.jsonl line 1"),
    ("metrics.jsonl", b"\xff\n", "not UTF-8"),
    ("eval.json", b"[1]", "evaluation"),
    ("eval.json", b'{"iteration": 10, "uniform": "high"}', "evaluation"),
]


@pytest.mark.parametrize("name,content,needle", RUN_FILES)
def test_malformed_run_files_give_one_line(mine: dict[str, Path], tmp_path: Path, name: str, content: bytes,
                                           needle: str) -> None:
    """Caught before the fix: config.json not UTF-8 → UnicodeDecodeError; a list line in metrics.jsonl or
    a list in eval.json → TypeError (all exit 1, with a traceback)."""
    (mine["run"] / name).write_bytes(content)
    refused(["report", mine["run"], "-o", tmp_path / "r.html"], needle)
    count("run-file cases")


def test_a_metrics_line_cut_short_is_skipped(mine: dict[str, Path], tmp_path: Path) -> None:
    with open(mine["run"] / "metrics.jsonl", "a") as fh:
        fh.write('{"iteration": 15, "lo')
    assert invoke(["report", mine["run"], "-o", tmp_path / "r.html"]).rc == 0


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


# ---- class 5: no file replaced, none half-written -------------------------------------------------

def test_existing_csv_and_report_are_never_modified(made: dict[str, Path], tmp_path: Path) -> None:
    """Caught before the fix: `summarize --csv EXISTING` without --overwrite rewrote the file, exit 0."""
    csv, page = tmp_path / "mine.csv", tmp_path / "mine.html"
    csv.write_text("precious\n")
    page.write_text("precious\n")
    before = snapshot(tmp_path)
    refused(["summarize", made["accuracy"], "-o", tmp_path / "s.zarr", "--csv", csv], "--csv", "already exists")
    refused(["report", made["accuracy"], "-o", page], "--out", "already exists")
    assert_untouched(before, snapshot(tmp_path))
    assert invoke(["summarize", made["accuracy"], "-o", tmp_path / "s.zarr", "--csv", csv, "--overwrite",
                   *FAST]).rc == 0
    assert csv.read_text().startswith("group,metric")


def _limited(args: list[object], limit: int) -> object:
    """Run a command in this process under a file-size limit (writes beyond it fail with EFBIG)."""
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        return invoke(args)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def test_a_full_disk_leaves_no_partial_file_and_the_old_one_intact(made: dict[str, Path], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store, page, csv = tmp_path / "s.zarr", tmp_path / "r.html", tmp_path / "s.csv"
    assert invoke(["summarize", made["accuracy"], "-o", store, "--csv", csv, *FAST]).rc == 0
    page.write_text("old report\n")
    before = snapshot(tmp_path)
    for args, limit in ((["summarize", made["accuracy"], "-o", store, "--overwrite", *FAST], 2000),
                        (["summarize", made["accuracy"], "-o", tmp_path / "new.zarr", *FAST], 2000),
                        (["report", made["accuracy"], "-o", page, "--overwrite"], 200_000)):
        outcome = _limited(args, limit)
        assert_clean(outcome, str(args))
        assert outcome.rc == 2 and "file too large" in outcome.err, outcome.err
        assert_untouched(before, snapshot(tmp_path))
    real = Path.write_text

    def full(self: Path, *args: object, **kwargs: object) -> int:
        if self.name.endswith(".tmp") and ".csv." in self.name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)  # the CSV is written after the store: the store goes too
    outcome = invoke(["summarize", made["accuracy"], "-o", tmp_path / "new.zarr", "--csv", tmp_path / "new.csv",
                      *FAST])
    assert_clean(outcome)
    assert outcome.rc == 2 and "no space left" in outcome.err, outcome.err
    outcome = invoke(["summarize", made["accuracy"], "-o", store, "--csv", csv, "--overwrite", *FAST])
    assert outcome.rc == 2 and "no space left" in outcome.err, outcome.err
    after = snapshot(tmp_path)
    assert after["s.csv"] == before["s.csv"] and after["r.html"] == before["r.html"]
    assert not [k for k in after if k.startswith(("new.", ".")) or k.endswith(".tmp")]


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


# ---- class 6: folders, sweeps, NaN where nothing was scored ---------------------------------------

def test_report_and_summarize_take_a_folder_of_runs_and_stores(made: dict[str, Path], tmp_path: Path) -> None:
    """Caught before the fix: 'store: cannot read FOLDER as a zarr v3 store (GroupNotFoundError)'."""
    folder = made["run"].parent
    outcome = invoke(["report", folder, "-o", tmp_path / "r.html", *FAST])
    assert outcome.rc == 0, outcome.err
    text = (tmp_path / "r.html").read_text()
    for name in ("acc.zarr", "st.zarr", "dyn.zarr", "sum.zarr", "run"):
        assert name in text
    before = snapshot(tmp_path)
    refused(["summarize", folder, "-o", tmp_path / "s.zarr", *FAST], "several stores for seed 7")  # nan.zarr, st.zarr
    assert_untouched(before, snapshot(tmp_path))  # neither kind was written
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for key in ("run", "accuracy", "stability", "summary"):
        shutil.copytree(made[key], mixed / made[key].name)
    outcome = invoke(["summarize", mixed, "-o", tmp_path / "s.zarr", *FAST])
    assert outcome.rc == 0, outcome.err
    assert {p.name for p in tmp_path.glob("s-*.zarr")} == {"s-accuracy.zarr", "s-stability.zarr"}
    sources = json.loads(read_store(tmp_path / "s-stability.zarr").attrs["sources"])
    assert [Path(s).name for s in sources] == ["st.zarr"]


def test_summarize_a_sweep_does_both_kinds(made: dict[str, Path], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Caught before the fix: 'the sweep … has accuracy and stability stores; choose one with --kind'."""
    monkeypatch.chdir(tmp_path)
    outcome = invoke(["summarize", made["sweep"], *FAST])
    assert outcome.rc == 0, outcome.err
    assert "accuracy mean" in outcome.out and "stability mean" in outcome.out
    assert read_store(tmp_path / "summary-accuracy.zarr").attrs["source_kind"] == "accuracy"
    assert read_store(tmp_path / "summary-stability.zarr").attrs["source_kind"] == "stability"
    only = invoke(["summarize", made["sweep"], "--kind", "stability", "-o", tmp_path / "one.zarr", *FAST])
    assert only.rc == 0 and "accuracy mean" not in only.out


def test_nothing_scored_is_nan_never_zero(made: dict[str, Path], tmp_path: Path) -> None:
    """Caught before the fix: an evaluation that scored nothing reported token accuracy 0.0 (and
    sequence accuracy 1.0); a grid cell with no scored sequence crashed summarize."""
    from gradscope.analysis.accuracy import sequence_accuracy, token_accuracy
    none = torch.full((2, 3), -100)
    assert torch.isnan(token_accuracy(none, none)) and torch.isnan(sequence_accuracy(none, none))
    zero = np.zeros(3, dtype=np.int64)
    result = AccuracyResult(Path("x"), 1, "r", zero, zero, np.zeros(3), zero, zero)
    assert np.isnan(result.token_accuracy) and np.isnan(result.sequence_accuracy)
    ds = read_store(made["accuracy"])
    total, acc = ds["grid_total"].values.copy(), ds["grid_accuracy"].values.copy()
    total[1, 1] = 0
    acc[:, 1, 1] = np.nan
    ds["grid_total"] = (ds["grid_total"].dims, total)
    ds["grid_accuracy"] = (ds["grid_accuracy"].dims, acc)
    write_store(ds, tmp_path / "empty-cell.zarr")
    outcome = invoke(["summarize", tmp_path / "empty-cell.zarr", "-o", tmp_path / "s.zarr", *FAST])
    assert outcome.rc == 0, outcome.err + outcome.tb
    assert row(outcome.out, "grid/rare/rare")[2].startswith("nan")
    assert row(outcome.out, "grid/frequent/frequent")[2] != "nan"
