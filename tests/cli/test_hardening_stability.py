"""The stability workflow as the commands use it: each checkpoint labelled by its own model, one checkpoint
in memory at a time, an existing store refused before any work (stability and dynamics), and a model
factory that calls sys.exit refused in one line."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import adapterkit
from tests.helpers.fuzzkit import invoke, leftovers, snapshot
from tests.helpers.hardening import FAST, V, input_runs
from tests.helpers.hardening import refused_one_line as refused
from tests.helpers.runs import DEFAULT_CORE, OTHER_CORE
from gradscope.cli.app import app
from gradscope.store import read_store


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small trained checkpoints: "first" (the default core), "other" and a factory's "lm"."""
    return input_runs(tmp_path_factory)


def test_checkpoints_of_different_models_are_labelled_by_their_own_config(runs: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    """Before the fix: a GRU and an LSTM given together were both recorded as "gru" (here: any two
    registered cores), and two
    checkpoints of one iteration in one folder shared (and overwrote) their rows of the table."""
    import shutil
    same = tmp_path / "same"
    same.mkdir()
    for core, role in ((DEFAULT_CORE, "first"), (OTHER_CORE, "other")):
        shutil.copy(runs[role], same / f"{core}.pt")
    out = tmp_path / "s.zarr"
    outcome = invoke(["stability", same / f"{DEFAULT_CORE}.pt", same / f"{OTHER_CORE}.pt", "-o", out, "--triplets", "1",
                      "--target-freq", "rare", "--disturbant", "rare", *FAST])
    assert outcome.rc == 0, outcome.err
    ds = read_store(out)
    assert ds["model"].values.tolist() == [f"{DEFAULT_CORE}-none", f"{OTHER_CORE}-none"]
    assert [c["model_config"]["core"] for c in json.loads(ds.attrs["checkpoints"])] == [DEFAULT_CORE, OTHER_CORE]
    rows = [ln for ln in outcome.out.splitlines() if "rare/rare" in ln]
    assert len(rows) == 2 and f"{DEFAULT_CORE}-none" in rows[0] and f"{OTHER_CORE}-none" in rows[1], outcome.out


def test_checkpoints_are_loaded_one_at_a_time(runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from gradscope.workflows import common
    from gradscope.workflows import stability as workflow
    alive: list[weakref.ref] = []
    held = []
    real = common.load_checkpoint  # what every workflow loads through (common.load_source)

    def load(path: Path):  # noqa: ANN202
        gc.collect()
        held.append(sum(r() is not None for r in alive))
        loaded = real(path)
        alive.append(weakref.ref(loaded))
        return loaded

    monkeypatch.setattr(common, "load_checkpoint", load)
    run = workflow.run_checkpoint_stability([runs["first"], runs["other"], runs["first"]],
                                 workflow.StabilityOptions(triplets=1, target_freq=("rare",)))
    assert held == [0, 0, 0]  # nothing of the previous checkpoint (optimizer state included) is held
    assert len(run.results) == 3


def test_an_existing_store_is_refused_before_any_work(runs: dict[str, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from gradscope.workflows import stability as workflow
    calls = []
    real = workflow.probe_stability
    monkeypatch.setattr(workflow, "probe_stability", lambda *a, **k: calls.append(1) or real(*a, **k))
    (tmp_path / "s.zarr").mkdir()
    (tmp_path / "s.zarr" / "mine").write_text("keep")
    (tmp_path / "file.zarr").write_text("a file")
    before = snapshot(tmp_path)
    for out, extra, message in (("s.zarr", (), "already exists"), ("file.zarr", ("--overwrite",), "is a file"),
                                ("missing/s.zarr", (), "does not exist")):
        for command in ("stability", "dynamics"):
            outcome = invoke([command, runs["first"], "-o", tmp_path / out, *extra, "-q"])
            assert outcome.rc == 2 and message in outcome.err, outcome.err
    assert calls == [] and snapshot(tmp_path) == before

    def appear(*a, **k):  # noqa: ANN002, ANN003, ANN202 - another run writes the store meanwhile
        (tmp_path / "late.zarr").mkdir(exist_ok=True)
        (tmp_path / "late.zarr" / "theirs").write_text("theirs")
        return real(*a, **k)

    monkeypatch.setattr(workflow, "probe_stability", appear)
    outcome = invoke(["stability", runs["first"], "-o", tmp_path / "late.zarr", "--triplets", "1", *FAST])
    assert outcome.rc == 2 and "already exists" in outcome.err, outcome.err
    assert (tmp_path / "late.zarr" / "theirs").read_text() == "theirs" and not leftovers(tmp_path)


@pytest.mark.parametrize("code", [0, 3])
def test_a_factory_that_calls_sys_exit_is_one_line(tmp_path: Path, runner, code: int) -> None:  # noqa: ANN001
    """A factory calling sys.exit(0) ended `gradscope stability` with exit 0, no output and no store;
    sys.exit(3) with exit 3."""
    factory = tmp_path / "fac.py"
    factory.write_text(f"import sys\ndef build(path):\n    sys.exit({code})\n")
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"")
    probes = tmp_path / "p.npy"
    np.save(probes, adapterkit.probes(V, 3, 6, 2, seed=6).numpy())
    result = runner.invoke(app, ["stability", str(ckpt), "--model-factory", f"{factory}:build", "--probes", str(probes),
                                 "--target-pos", "2", "-o", str(tmp_path / "s.zarr"), "-q"])
    refused(result, "--model-factory", "SystemExit")
    assert not (tmp_path / "s.zarr").exists()
