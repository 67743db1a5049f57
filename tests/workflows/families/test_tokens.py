"""The default evaluation of a task family, as the accuracy store holds it (SPEC §5): token, sequence and
Damerau–Levenshtein accuracy per checkpoint and per time step, checked as numbers against computations
written here, for a hand-made predictor and for the model's own predictions, with a Damerau–Levenshtein
distance written out (unrestricted, Lowrance–Wagner)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from typer.testing import CliRunner

import gradscope
from gradscope.cli.app import app
from gradscope.store import read_store
from gradscope.workflows.families import tokens as token_evaluation  # the default evaluation (issue #39)

from tests.analysis.test_distance import brute_dl

IGNORE = -100


damerau_levenshtein = brute_dl  # the textbook algorithm, written out in tests/analysis/test_distance.py


def test_the_reference_distance_itself() -> None:
    assert damerau_levenshtein([1, 2], [2, 1]) == 1  # one transposition
    assert damerau_levenshtein([3, 1], [1, 2, 3]) == 2  # "ca" → "abc": unrestricted 2 (OSA says 3)
    assert damerau_levenshtein([1, 2, 3], [1, 2, 3]) == 0 and damerau_levenshtein([], [4, 4]) == 2


def _scored_rows(preds: torch.Tensor, targets: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
    keep = targets != IGNORE
    return ([p[k].tolist() for p, k in zip(preds, keep)], [t[k].tolist() for t, k in zip(targets, keep)])


def _check_store_against(ds: xr.Dataset, index: int, preds: torch.Tensor, targets: torch.Tensor) -> None:
    """Checkpoint ``index`` of an accuracy store against predictions and targets (n, T) computed here."""
    pred_rows, target_rows = _scored_rows(preds, targets)
    dl = np.array([damerau_levenshtein(p, t) for p, t in zip(pred_rows, target_rows)])
    last = ds.isel(checkpoint=index)
    np.testing.assert_array_equal(last["sequence_dl"].values, dl)
    assert float(last["dl_distance"]) == pytest.approx(dl.mean(), abs=1e-12)
    scored = targets != IGNORE
    right = (preds == targets) & scored
    assert float(last["token_accuracy"]) == pytest.approx(float(right.sum() / scored.sum()), abs=1e-12)
    assert float(last["sequence_accuracy"]) == pytest.approx(float((right == scored).all(1).double().mean()))
    times = torch.nonzero(scored.any(0)).flatten()  # 0-based time steps that hold targets
    assert ds["time"].values.tolist() == (times + 1).tolist()  # stored 1-based
    per_time = (right.sum(0).double() / scored.sum(0).double())[times]
    np.testing.assert_allclose(last["position_accuracy"].values, per_time.numpy(), atol=1e-7)


def test_accuracy_store_against_a_hand_made_predictor(runner: CliRunner, trained_runs: dict, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Reversal with planted errors: the first two outputs transposed (DL 1 where they differ),
    and the last output wrong on every other row (DL +1). So accuracy falls at the start of the
    output phase and at its end, differently: a store reversed in time shows it."""
    ckpt = trained_runs["uniform"] / "step-0000010.pt"
    task = gradscope.load(ckpt).config.task
    length, vocab = task.length, task.vocab_size

    def planted(model: object, inputs: torch.Tensor, chunk: int = 0) -> torch.Tensor:
        preds = inputs.clone()
        out = inputs[:, :length].flip(1).clone()  # the right answer, x_L … x_1
        out[:, [0, 1]] = out[:, [1, 0]]
        out[::2, -1] = (out[::2, -1] + 1) % vocab
        preds[:, length:] = out
        return preds

    monkeypatch.setattr(token_evaluation, "predict", planted)
    out = tmp_path / "a.zarr"
    result = runner.invoke(app, ["accuracy", str(ckpt), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    ds = read_store(out, kind="accuracy")
    held = gradscope.load(ckpt).heldout.uniform
    preds = planted(None, held.inputs)
    _check_store_against(ds, 0, preds, held.targets)
    # the planted structure itself: a time-reversed store could not match it
    acc = ds["position_accuracy"].values[0]
    assert acc[-1] == pytest.approx(0.5) and acc[2] == 1.0 and acc[0] < 0.5 and acc[0] == acc[1]
    assert 0.5 < float(ds["dl_distance"][0]) < 2.0


def test_accuracy_store_against_the_models_own_predictions(runner: CliRunner, trained_runs: dict,
                                                           tmp_path: Path) -> None:
    """Every checkpoint of a real run: predictions computed here from the loaded model."""
    out = tmp_path / "a.zarr"
    assert runner.invoke(app, ["accuracy", str(trained_runs["dual"]), "-o", str(out), "-q"]).exit_code == 0
    ds = read_store(out, kind="accuracy")
    for index, ckpt in enumerate(sorted(trained_runs["dual"].glob("step-*.pt"))):
        loaded = gradscope.load(ckpt)
        with torch.no_grad():
            preds = loaded.model(loaded.heldout.uniform.inputs).argmax(-1)
        assert int(ds["iteration"][index]) == loaded.iteration
        _check_store_against(ds, index, preds, loaded.heldout.uniform.targets)
    assert float(ds["dl_distance"].max()) > 0  # an untrained-ish model errs: a distance of 0 would be wrong
