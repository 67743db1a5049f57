"""Multi-query associative recall (gradscope/tasks/mqar.py): its rows against their definition, its
counts against a plain per-query loop, and the family through every command (train, accuracy,
stability, dynamics, summarize, report). The shared family contract (tests/helpers/contracts.py)
runs on it too, as on every registered family."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import gradscope
from gradscope.cli.app import app
from gradscope.errors import GradscopeError
from gradscope.store import read_store
from gradscope.tasks import IGNORE, make_task
from gradscope.tasks.config import TaskConfig
from gradscope.tasks.mqar import distance_bins
from gradscope.train.evaluate import predict


def task(**kw: object):  # noqa: ANN201
    return make_task(TaskConfig(name="mqar", **{"vocab_size": 16, "length": 8, **kw}))


def test_rows_hold_distinct_keys_each_asked_once_for_its_value() -> None:
    t = task(distribution="dual")
    b = t.sample(200, torch.Generator().manual_seed(0))
    L, P = 8, 4
    assert b.inputs.shape == b.targets.shape == (200, 2 * L)
    for x, y in zip(b.inputs.tolist(), b.targets.tolist()):
        keys, values = x[0:L:2], x[1:L:2]
        assert len(set(keys)) == P and max(x[:L]) < 16
        asked = x[L::2]
        assert sorted(asked) == sorted(keys) and x[L + 1::2] == [16] * P  # every key once; blanks = query token
        assert y[L::2] == [values[keys.index(q)] for q in asked]
        assert y[:L] == [IGNORE] * L and y[L + 1::2] == [IGNORE] * P


def test_dual_keys_are_rare_at_the_task_rate() -> None:
    """The first key of a row is one draw of the dual distribution: rare with probability rarity."""
    n = 20_000
    first = task(distribution="dual", rarity=0.125).sample(n, torch.Generator().manual_seed(1)).inputs[:, 0]
    share = float((first >= 8).double().mean())
    assert abs(share - 0.125) < 4 * (0.125 * 0.875 / n) ** 0.5
    uniform = task().sample(n, torch.Generator().manual_seed(1)).inputs[:, 0]
    assert abs(float((uniform >= 8).double().mean()) - 0.5) < 4 * (0.25 / n) ** 0.5


def test_counts_equal_a_plain_loop_over_queries() -> None:
    t = task(distribution="dual")
    b = t.sample(300, torch.Generator().manual_seed(2))
    preds = torch.where(torch.rand(b.targets.shape, generator=torch.Generator().manual_seed(3)) < 0.6,
                        b.targets.clamp(min=0), torch.zeros_like(b.targets))
    got = t.score(b, preds)
    bins = distance_bins(8)
    correct, total = np.zeros((2, len(bins)), int), np.zeros((2, len(bins)), int)
    for x, y, p in zip(b.inputs.tolist(), b.targets.tolist(), preds.tolist()):
        for j in range(4):
            pos = 8 + 2 * j
            distance = pos - x[0:8:2].index(x[pos]) * 2
            k = next(i for i, (a, e) in enumerate(bins) if a <= distance <= e)
            g = int(x[pos] >= 8)
            total[g, k] += 1
            correct[g, k] += p[pos] == y[pos]
    np.testing.assert_array_equal(got["total"], total)
    np.testing.assert_array_equal(got["correct"], correct)
    assert [tuple(e) for e in got["edges"]] == bins == [(2, 4), (6, 8), (10, 12), (14, 14)]


def test_a_uniform_vocabulary_names_its_key_groups_by_id_not_frequency() -> None:
    """A uniform vocabulary has no rare keys: its two halves of the ids are named lower-ids and upper-ids
    in the counts and the stored part (they were reported as "frequent" and "rare")."""
    from gradscope.tasks.mqar import MQAR

    for distribution, names in (("uniform", ["lower-ids", "upper-ids"]), ("dual", ["frequent", "rare"])):
        t = task(distribution=distribution)
        b = t.sample(50, torch.Generator().manual_seed(4))
        counts = t.score(b, b.targets.clamp(min=0))
        assert list(counts["groups"]) == names
        _, coords = MQAR.accuracy_part([counts])
        assert list(coords["key_group"]) == names


@pytest.mark.parametrize("settings, flag", [({"length": 7}, "length"), ({"length": 40}, "length")])
def test_settings_it_cannot_run_are_refused_naming_the_setting(settings: dict, flag: str) -> None:
    with pytest.raises(GradscopeError, match=f"^{flag}: "):
        task(**settings)


def ok(runner: CliRunner, args: list[str]) -> None:
    done = runner.invoke(app, args)
    assert done.exit_code == 0, (args[0], done.stderr or done.stdout)


@pytest.fixture(scope="module")
def mqar_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("mqar") / "run"
    ok(CliRunner(), ["train", "--task", "mqar", "--distribution", "dual", "--vocab-size", "8", "--length", "4",
                     "--embed-size", "4", "--hidden-size", "8", "--iterations", "20", "--heldout-size", "64", "--batch-size", "16", "-q",
                     "-o", str(run)])
    return run


def test_mqar_through_every_command(mqar_run: Path, tmp_path: Path) -> None:
    """train → accuracy (its part equals a per-query loop over the checkpoint's own predictions) →
    stability → dynamics → summarize (its metrics) → report (its section)."""
    runner = CliRunner()
    run, acc = mqar_run, tmp_path / "accuracy.zarr"
    done = runner.invoke(app, ["accuracy", str(run), "-o", str(acc), "-q"])
    assert done.exit_code == 0 and "recall after rare keys" in done.stdout
    ds = read_store(acc)
    loaded = gradscope.load(run)
    held = loaded.heldout.uniform
    preds = predict(loaded.model, held.inputs)
    for g in range(2):
        asked, right = held.inputs[:, 4::2], preds[:, 4::2] == held.targets[:, 4::2]
        mask = (asked >= 4) if g else (asked < 4)
        assert float(ds["key_accuracy"].values[-1, g]) == pytest.approx(float(right[mask].double().mean()))
    assert int(ds["recall_n"].sum()) == held.inputs.shape[0] * 2
    stab, dyn = tmp_path / "stability.zarr", tmp_path / "dynamics.zarr"
    ok(runner, ["stability", str(run), "--triplets", "3", "-o", str(stab), "-q"])
    ok(runner, ["dynamics", str(run), "--sequences", "2", "--grid-sequences", "1", "--trajectories", "2", "--steps", "20",
        "--lyap-warmup", "4", "--sv", "3", "-o", str(dyn), "-q"])
    assert np.isfinite(read_store(stab)["score_default"].values).all()
    assert np.isfinite(read_store(dyn, kind="dynamics")["lyapunov"].values[..., 0]).all()
    summary = tmp_path / "summary.zarr"
    ok(runner, ["summarize", str(acc), "--resamples", "50", "-o", str(summary)])
    metrics = {str(m) for m in read_store(summary)["metric"].values}
    assert {"recall/frequent", "recall/rare", "recall/rare/d2-2"} <= metrics
    html = tmp_path / "report.html"
    ok(runner, ["report", str(run), str(acc), str(stab), str(dyn), "-o", str(html)])
    assert 'id="task-mqar"' in html.read_text()


def _negative(ds):  # noqa: ANN001, ANN202
    n = ds["recall_n"].values.copy()
    n[0, 0] = -1
    return ds.assign(recall_n=(ds["recall_n"].dims, n))


@pytest.mark.parametrize("damage, message", [
    (_negative, "recall_n holds int64 values; expected non-negative integers"),
    (lambda ds: ds.assign_coords(distance=np.asarray(["a"] * ds.sizes["distance"], dtype=object)), "distance labels repeat"),
    (lambda ds: ds.drop_vars("distance_start"), "lacks the coordinate(s) distance_start"),
    (lambda ds: ds.drop_vars("key_accuracy"), "lacks the variable(s) key_accuracy of the mqar task"),
    (lambda ds: ds.assign(key_accuracy=(("checkpoint", "distance"), ds["recall_accuracy"].values[:, 0])),
     "key_accuracy has dims"),
])
def test_a_damaged_mqar_store_is_one_line_from_its_declared_layout(mqar_run: Path, tmp_path: Path, damage,  # noqa: ANN001
                                                                   message: str) -> None:
    """The family's declared layout is the store's schema: damage to its part is refused in one line."""
    from gradscope.store.io import write_store

    runner = CliRunner()
    acc = tmp_path / "accuracy.zarr"
    ok(runner, ["accuracy", str(mqar_run), "-o", str(acc), "-q"])
    bad = tmp_path / "bad.zarr"
    write_store(damage(read_store(acc)), bad)
    done = runner.invoke(app, ["summarize", str(bad), "-o", str(tmp_path / "s.zarr")])
    assert done.exit_code == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
