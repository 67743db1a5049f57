"""`summarize` and `report` on odd inputs, as a whole: NaN scores counted in the table, the CSV, the store and
the report; an existing CSV or report never modified and a full disk leaving no partial file; a folder of
runs and stores, a sweep of both kinds, and nothing scored shown as NaN, never 0. One regression test per
case, each of which failed before its fix (the case it caught is in its docstring). What the store
reader itself refuses is tested in tests/store/.
"""

from __future__ import annotations

import errno
import json
import resource
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.fuzzkit import assert_clean, assert_untouched, invoke
from tests.helpers.storefuzz import refused
from tests.helpers.storekit import FAST, built, snapshot
from gradscope.store import read_store, write_store
from gradscope.store.records import AccuracyResult


@pytest.fixture(scope="session")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small real stores, a run and a sweep (``storekit.built``)."""
    return built(tmp_path_factory.mktemp("hardening-stores") / "base")


def row(out: str, metric: str) -> list[str]:
    """The cells of the summary table's row for ``metric``."""
    lines = [ln for ln in out.splitlines() if f" {metric} " in ln]
    assert len(lines) == 1, out
    return [c.strip() for c in lines[0].strip().strip("│").split("│")]


# ---- NaN counted in summaries ------------------------------------------------------------------

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


# ---- no file replaced, none half-written ---------------------------------------------------------

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


# ---- folders, sweeps, NaN where nothing was scored -----------------------------------------------

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
