"""The accuracy figures against the stores' numbers: the vocabulary figure's error bars, the grid figure
from a summary (with its intervals) and from accuracy stores (without), and the training curves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from gradscope.errors import GradscopeError
from gradscope.models import CORES
from gradscope.reports.accuracy_figures import grid_figure_accuracy, grid_figure_summary, training_figure, vocab_figure
from gradscope.store import provenance, read_store, write_store
from gradscope.store.inputs import load_inputs
from tests.helpers.runs import DEFAULT_CORE


def test_vocab_figure_error_bars_are_the_store_numbers() -> None:
    from gradscope.analysis.bootstrap import Interval
    from gradscope.store.summary import summary_dataset
    from gradscope.workflows.summarize import SummaryEntry
    known = {("gru", "none", "16"): (0.70, 0.65, 0.74), ("gru", "none", "64"): (0.50, 0.41, 0.55),
             ("gru", "sinusoidal", "16"): (0.90, 0.88, 0.93), ("gru", "sinusoidal", "64"): (0.85, 0.80, 0.86)}
    entries = [SummaryEntry(key, " ".join(key), "token_accuracy", Interval(m, lo, hi, 5, 0), (1, 2, 3, 4, 5),
                            (m,) * 5) for key, (m, lo, hi) in known.items()]
    ds = summary_dataset(entries, ("core", "pe", "vocab_size"), {"kind": "summary"})
    fig = vocab_figure(ds)
    assert fig is not None and len(fig.data) == 2
    for trace in fig.data:
        pe = "none" if "vanilla" in trace.name.lower() else "sinusoidal"
        rows = [known[("gru", pe, k)] for k in ("16", "64")]
        assert list(trace.x) == [16, 64]
        assert list(trace.y) == pytest.approx([m for m, _, _ in rows])
        assert list(trace.error_y.array) == pytest.approx([hi - m for m, _, hi in rows])
        assert list(trace.error_y.arrayminus) == pytest.approx([m - lo for m, lo, _ in rows])


def _summary(entries: dict[tuple[str, ...], dict[str, tuple[float, float, float]]], by: tuple[str, ...]) -> xr.Dataset:
    from gradscope.analysis.bootstrap import Interval
    from gradscope.store.summary import summary_dataset
    from gradscope.workflows.summarize import SummaryEntry
    rows = [SummaryEntry(key, " ".join(key), metric, Interval(m, lo, hi, 3, 0), (1, 2, 3), (m,) * 3)
            for key, metrics in entries.items() for metric, (m, lo, hi) in metrics.items()]
    return summary_dataset(rows, by, {"kind": "summary", "by": json.dumps(list(by)), "confidence": 0.95})


def _cell(fig, trace, rows: tuple[str, ...], cols: tuple[str, ...]) -> tuple[str, str]:
    """(row, column) names of the subplot a trace sits in (make_subplots numbers axes row-major)."""
    k = int(trace.xaxis[1:] or 1) - 1
    return rows[k // len(cols)], cols[k % len(cols)]


def test_grid_figure_from_a_summary_has_the_store_cis() -> None:
    rng = np.random.default_rng(0)
    cells = [(t, d) for t in ("frequent", "rare") for d in ("frequent", "rare")]
    known = {}
    for pe in ("none", "sinusoidal"):
        metrics = {}
        for t, d in cells:
            for b in (1, 2, 3):
                m = float(rng.uniform(0.2, 0.8))
                low, high = m - float(rng.uniform(0.01, 0.1)), m + float(rng.uniform(0.01, 0.1))
                metrics[f"grid/{t}/{d}/bin{b}"] = (m, low, high)
            metrics[f"grid/{t}/{d}"] = (0.5, 0.4, 0.6)  # the cell total is not a bin: not plotted
        known[("gru", pe)] = metrics
    fig = grid_figure_summary(_summary(known, ("core", "pe")))
    assert fig is not None and len(fig.data) == 2 * 4
    for trace in fig.data:
        pe = "none" if trace.name == "GRU vanilla" else "sinusoidal"
        assert trace.name in ("GRU vanilla", "GRU PE (sinusoidal)")
        t, d = _cell(fig, trace, ("frequent", "rare"), ("frequent", "rare"))
        rows = [known[("gru", pe)][f"grid/{t}/{d}/bin{b}"] for b in (1, 2, 3)]
        assert list(trace.x) == [1, 2, 3]
        assert list(trace.y) == pytest.approx([m for m, _, _ in rows])
        assert list(trace.error_y.array) == pytest.approx([hi - m for m, _, hi in rows])
        assert list(trace.error_y.arrayminus) == pytest.approx([m - lo for m, lo, _ in rows])
        assert [c[2] for c in trace.customdata] == [3, 3, 3] and "n = " in trace.hovertemplate
    assert grid_figure_summary(_summary({("gru", "none"): {"token_accuracy": (0.5, 0.4, 0.6)}}, ("core", "pe"))) is None
    assert vocab_figure(_summary({("gru", "none"): {"token_accuracy": (0.5, 0.4, 0.6)}}, ("core", "pe"))) is None


def _accuracy_store(path: Path, seed: int) -> Path:
    """An accuracy store in the documented layout (two checkpoints, 2×2 grid, 3 bins), known numbers."""
    rng = np.random.default_rng(seed)
    groups = np.asarray(["frequent", "rare"], dtype=object)
    ds = xr.Dataset(
        {"token_accuracy": ("checkpoint", rng.uniform(size=2)),
         "grid_bin_accuracy": (("checkpoint", "target_group", "disturbant_group", "bin"),
                               rng.uniform(size=(2, 2, 2, 3))),
         "grid_n": (("target_group", "disturbant_group", "bin"), rng.integers(5, 50, size=(2, 2, 3)))},
        coords={"checkpoint": [0, 1], "iteration": ("checkpoint", [100, 200]), "target_group": groups,
                "disturbant_group": groups, "bin": [0, 1, 2], "bin_start": ("bin", [1, 4, 7]),
                "bin_end": ("bin", [3, 6, 8])},
        attrs=provenance("accuracy", "test", "cpu", {
            "model_config": {"core": "lstm", "pe": "sinusoidal"}, "task_config": {"name": "reverse", "vocab_size": 8},
            "train_config": {"seed": seed}, "checkpoints": []}))
    return write_store(ds, path)


def test_grid_figure_from_accuracy_stores_has_no_ci(tmp_path: Path) -> None:
    paths = [_accuracy_store(tmp_path / f"a{s}.zarr", s) for s in (1, 2)]
    items = load_inputs(paths)
    assert {i.label for i in items} == {"LSTM PE (sinusoidal)"}  # same configuration, two seeds
    for iteration, k in ((None, 1), (100, 0)):
        fig = grid_figure_accuracy(items, iteration)
        assert len(fig.data) == 2 * 4
        for trace in fig.data:
            seed = int(trace.name.rsplit(" ", 1)[1])
            ds = read_store(paths[seed - 1])
            t, d = _cell(fig, trace, ("frequent", "rare"), ("frequent", "rare"))
            assert list(trace.y) == pytest.approx(
                ds["grid_bin_accuracy"].isel(checkpoint=k).sel(target_group=t, disturbant_group=d).values)
            n = ds["grid_n"].sel(target_group=t, disturbant_group=d).values.tolist()
            assert [c[2] for c in trace.customdata] == n
            assert trace.error_y.array is None
    assert list(fig.layout.xaxis3.ticktext) == ["1–3", "4–6", "7–8"]
    with pytest.raises(GradscopeError, match="iteration: got 150"):
        grid_figure_accuracy(items, 150)


def test_training_figure_is_metrics_jsonl(trained_runs: dict) -> None:
    run = trained_runs["dual"]
    items = load_inputs([run])
    fig = training_figure(items)
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    loss, acc, star = fig.data
    assert list(loss.x) == [m["iteration"] for m in lines] and list(loss.y) == [m["loss"] for m in lines]
    assert list(acc.y) == [m["accuracy"] for m in lines]
    evaluation = json.loads((run / "eval.json").read_text())
    assert list(star.y) == [evaluation["uniform"]["token_accuracy"]] and list(star.x) == [evaluation["iteration"]]
    assert loss.name == f"{CORES[DEFAULT_CORE].label} vanilla, seed 7"
