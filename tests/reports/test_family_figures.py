"""A task family's own report figure (``gradscope.reports.family_figures``), drawn from hand-made stores of a
family registered only inside these tests: one panel per declared panel, one line per configuration (and
value of ``split``), its mean over the configuration's stores with bars from the lowest to the highest seed
(a single store with ``bounds``: its own interval), at the report's checkpoint; each number checked here.
That a registered family's section reaches a written report is tests/reports/test_experiment_figures.py's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import xarray as xr

from gradscope.errors import GradscopeError
from gradscope.reports.family_figures import DASHES, family_figure
from gradscope.store.inputs import Input
from gradscope.tasks import TASKS
from gradscope.tasks.family import FLOAT, INT, STR, Panel, ReportSection, Variable

NAN = np.nan
PALETTE = {"A": "#111111", "B": "#222222"}


class Echo(TASKS["reverse"]):  # type: ignore[misc, valid-type]
    """A family whose store part is declared here: accuracy per group and time, a cosine with its interval,
    and accuracy per bucket of positions (labelled by their first and last)."""

    layout: ClassVar[dict[str, Variable]] = {
        "acc": Variable(dims=("checkpoint", "group", "time"), kind=FLOAT),
        "cos": Variable(dims=("checkpoint", "time"), kind=FLOAT),
        "cos_low": Variable(dims=("checkpoint", "time"), kind=FLOAT),
        "cos_high": Variable(dims=("checkpoint", "time"), kind=FLOAT),
        "bucket_acc": Variable(dims=("checkpoint", "bucket"), kind=FLOAT),
        "group": Variable(dims=("group",), kind=STR), "time": Variable(dims=("time",), kind=INT),
        "bucket": Variable(dims=("bucket",), kind=STR), "first": Variable(dims=("bucket",), kind=INT),
        "last": Variable(dims=("bucket",), kind=INT),
    }


@pytest.fixture(autouse=True)
def _echo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TASKS, "echo", Echo)


SPLIT = ReportSection(heading="Echo by group", text="t", panels=(
    Panel(variable="acc", x="time", split="group", title="per time", x_title="time step"),
    Panel(variable="acc", x="time", split="group", title="again", log_y=True)))


def store(label: str, acc: list, cos: tuple[list, list, list] = ([0.5] * 3,) * 3, bucket: list | None = None,
          path: str = "s.zarr") -> Input:
    """An accuracy store of 2 checkpoints (iterations 10, 20): ``acc`` (group × time) at the last one, the
    first checkpoint at half those values; ``cos`` as (mean, low, high) over time; ``bucket`` accuracy."""
    acc_last = np.array(acc, dtype=np.float64)
    cos_parts = [np.stack([np.zeros(3), np.array(c, dtype=np.float64)]) for c in cos]
    buckets = np.array(bucket if bucket is not None else [0.0] * 3, dtype=np.float64)
    ds = xr.Dataset(
        {"acc": (("checkpoint", "group", "time"), np.stack([acc_last / 2, acc_last])),
         "cos": (("checkpoint", "time"), cos_parts[0]), "cos_low": (("checkpoint", "time"), cos_parts[1]),
         "cos_high": (("checkpoint", "time"), cos_parts[2]),
         "bucket_acc": (("checkpoint", "bucket"), np.stack([np.zeros(3), buckets]))},
        coords={"checkpoint": [0, 1], "iteration": ("checkpoint", [10, 20]), "group": ["frequent", "rare"],
                "time": [4, 5, 6], "bucket": ["decile 1", "decile 2", "all"], "first": ("bucket", [1, 5, 1]),
                "last": ("bucket", [4, 5, 9])},
        attrs={"task_config": json.dumps({"name": "echo"})})
    return Input(Path(path), "accuracy", ds=ds, label=label)


def lines(fig) -> dict[str, dict]:  # noqa: ANN001
    """Per trace name and subplot x-axis: x, y, the bars (above, below), colour, dash, legend shown."""
    return {(t.name, t.xaxis): dict(x=list(t.x), y=list(t.y), up=list(t.error_y.array), down=list(t.error_y.arrayminus),
                                    color=t.line.color, dash=t.line.dash, legend=t.showlegend) for t in fig.data}


def test_a_line_per_configuration_and_split_is_the_mean_over_its_seeds() -> None:
    stores = [store("A", [[0.25, 0.5, 1.0], [0.0, 0.5, 0.75]]), store("A", [[0.75, 0.5, 0.0], [0.5, 0.5, 0.25]]),
              store("B", [[1.0, 1.0, 1.0], [0.0, 0.25, NAN]])]
    fig = family_figure(SPLIT, stores, palette=PALETTE)
    got = lines(fig)
    assert set(got) == {(n, ax) for n in ("A (2 seeds), frequent", "A (2 seeds), rare", "B (1 seed), frequent",
                                          "B (1 seed), rare") for ax in ("x", "x2")}
    a = got["A (2 seeds), frequent", "x"]
    assert a["x"] == ["4", "5", "6"] and a["y"] == [0.5, 0.5, 0.5]
    assert a["up"] == [0.25, 0.0, 0.5] and a["down"] == [0.25, 0.0, 0.5]  # from the lowest to the highest seed
    assert got["A (2 seeds), rare", "x"]["y"] == [0.25, 0.5, 0.5]
    b = got["B (1 seed), rare", "x"]
    assert b["y"] == [0.0, 0.25, None] and b["up"] == [0.0, 0.0, None]  # NaN: a gap, never 0
    assert {k[0]: v["color"] for k, v in got.items()} == {"A (2 seeds), frequent": "#111111", "A (2 seeds), rare":
                                                          "#111111", "B (1 seed), frequent": "#222222",
                                                          "B (1 seed), rare": "#222222"}
    assert {v["dash"] for k, v in got.items() if k[0].endswith("frequent")} == {DASHES[0]}
    assert {v["dash"] for k, v in got.items() if k[0].endswith("rare")} == {DASHES[1]}
    assert all(v["legend"] for (_, ax), v in got.items() if ax == "x")  # each name once in the legend
    assert not any(v["legend"] for (_, ax), v in got.items() if ax == "x2")
    assert all(t.mode == "lines+markers" for t in fig.data)


def test_the_panels_axes_and_titles_are_as_declared() -> None:
    fig = family_figure(SPLIT, [store("A", [[1.0] * 3] * 2)], palette=PALETTE)
    assert [a.text for a in fig.layout.annotations][:2] == ["per time", "again"]
    assert fig.layout.xaxis.title.text == "time step" and fig.layout.xaxis2.title.text == "time"  # x_title, else x
    assert fig.layout.xaxis.type == "category" == fig.layout.xaxis2.type
    assert fig.layout.yaxis.title.text == "accuracy" and fig.layout.yaxis.type is None and fig.layout.yaxis2.type == "log"
    assert "Echo by group" in fig.layout.title.text


def test_the_reports_checkpoint_is_drawn() -> None:
    stores = [store("A", [[0.5, 1.0, 0.25], [0.0] * 3], path="a.zarr")]
    assert lines(family_figure(SPLIT, stores, 10))["A (1 seed), frequent", "x"]["y"] == [0.25, 0.5, 0.125]
    assert lines(family_figure(SPLIT, stores, 20))["A (1 seed), frequent", "x"]["y"] == [0.5, 1.0, 0.25]
    with pytest.raises(GradscopeError, match=f"^{re.escape('iteration: got 15; a.zarr has iterations 10, 20')}$"):
        family_figure(SPLIT, stores, 15)


def test_a_single_store_shows_its_own_interval_and_seeds_their_range() -> None:
    section = ReportSection(heading="Cosine", text="t", panels=(
        Panel(variable="cos", x="time", bounds=("cos_low", "cos_high"), y_title="cosine"),))
    one = lines(family_figure(section, [store("A", [[0.0] * 3] * 2, ([0.5, 0.75, 1.0], [0.25, 0.5, 0.5],
                                                                      [0.75, 1.0, 1.0]))]))
    assert one["A (1 seed)", "x"]["y"] == [0.5, 0.75, 1.0]
    assert one["A (1 seed)", "x"]["up"] == [0.25, 0.25, 0.0] and one["A (1 seed)", "x"]["down"] == [0.25, 0.25, 0.5]
    two = lines(family_figure(section, [store("A", [[0.0] * 3] * 2, ([0.5, 0.5, 0.5], [0.0] * 3, [1.0] * 3)),
                                        store("A", [[0.0] * 3] * 2, ([1.0, 0.5, 0.0], [0.0] * 3, [1.0] * 3))]))
    assert two["A (2 seeds)", "x"]["y"] == [0.75, 0.5, 0.25]
    assert two["A (2 seeds)", "x"]["up"] == [0.25, 0.0, 0.25] == two["A (2 seeds)", "x"]["down"]  # the seeds' range


def test_x_labels_from_two_coordinates_and_only_the_values_asked_for() -> None:
    section = ReportSection(heading="Buckets", text="t", panels=(
        Panel(variable="bucket_acc", x="bucket", x_ticks=("first", "last"), title="all"),
        Panel(variable="bucket_acc", x="bucket", x_only="decile", title="deciles")))
    got = lines(family_figure(section, [store("A", [[0.0] * 3] * 2, bucket=[0.25, 0.5, 0.75])], palette=PALETTE))
    assert got["A (1 seed)", "x"]["x"] == ["1–4", "5", "1–9"] and got["A (1 seed)", "x"]["y"] == [0.25, 0.5, 0.75]
    assert got["A (1 seed)", "x2"]["x"] == ["decile 1", "decile 2"] and got["A (1 seed)", "x2"]["y"] == [0.25, 0.5]


def test_stores_without_the_sections_variables_are_left_out() -> None:
    full = store("A", [[1.0] * 3] * 2)
    lacking = store("B", [[0.0] * 3] * 2)
    lacking.ds = lacking.ds.drop_vars("acc")
    other = Input(Path("x.zarr"), "stability", ds=xr.Dataset(), label="C")
    fig = family_figure(SPLIT, [full, lacking, other], palette=PALETTE)
    assert {name for name, _ in lines(fig)} == {"A (1 seed), frequent", "A (1 seed), rare"}
    assert family_figure(SPLIT, [lacking, other]) is None  # no store holds them: no figure


def test_labels_the_palette_lacks_get_colours_of_their_own() -> None:
    fig = family_figure(SPLIT, [store("A", [[1.0] * 3] * 2), store("C", [[1.0] * 3] * 2)], palette=PALETTE)
    colours = {name.split(" ")[0]: v["color"] for (name, _), v in lines(fig).items()}
    assert colours["A"] == "#111111" and colours["C"] not in PALETTE.values()
