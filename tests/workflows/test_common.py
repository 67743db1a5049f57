"""What every workflow shares, as the commands use it: each checkpoint labelled by its own model, and one
checkpoint in memory at a time."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import pytest

from tests.helpers.fuzzkit import invoke
from tests.helpers.hardening import FAST, input_runs
from tests.helpers.runs import DEFAULT_CORE, OTHER_CORE
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
