"""Diverged models: a checkpoint whose weights are NaN, ±Inf or huge gives NaN scores that are counted,
with a warning, and its store is still written; it never crashes LAPACK (how the dynamics table shows NaN:
tests/cli/test_dynamics.py).

The diverged checkpoints are real small checkpoints of every core with their weights overwritten
(whole tensors, or a single entry), as a blown-up training run would leave them.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.fuzzkit import assert_clean, count, invoke, leftovers
from gradscope.store import read_store
from gradscope.workflows.dynamics import DynamicsOptions, run_checkpoint_dynamics
from gradscope.workflows.common import DivergedWarning
from gradscope.workflows.stability import StabilityOptions, run_checkpoint_stability
from tests.helpers.hardening import small_checkpoint
from tests.helpers.runs import COMPLEX_CORE, DEFAULT_CORE, OTHER_CORE

CORES = (DEFAULT_CORE, OTHER_CORE, COMPLEX_CORE)  # from the registry, by kind (tests/helpers/runs.py)
POISONS = ("nan", "inf", "huge", "one-nan")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One small trained checkpoint per core."""
    return {core: small_checkpoint(tmp_path_factory, core) for core in CORES}


def poison(src: Path, dst: Path, how: str) -> Path:
    """A copy of checkpoint ``src`` with its float weights made non-finite or huge."""
    ckpt = torch.load(src, weights_only=True)
    for name, w in ckpt["model"].items():
        if not w.is_floating_point() or name.startswith("embedding"):
            continue
        if how == "nan":
            w.fill_(float("nan"))
        elif how == "inf":
            w.fill_(float("inf"))
        elif how == "huge":
            w.mul_(1e30)
        elif how == "one-nan" and w.dim() == 2:
            w.view(-1)[0] = float("nan")
            break
    torch.save(ckpt, dst)
    return dst


STAB = ("--triplets", "2", "--resamples", "50", "-q")
DYN = ("--sequences", "1", "--grid-sequences", "1", "--trajectories", "1", "--steps", "12", "--lyap-warmup", "2", "-q")


def _warning_lines(err: str, how: str = "huge") -> list[str]:
    """stderr's lines but the weights warning (issue #36), which NaN and Inf weights must give first."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if how != "huge":
        assert "NaN or Inf weights" in lines[0], err
    return [ln for ln in lines if "NaN or Inf weights" not in ln]


@pytest.mark.parametrize("core,how", [(c, h) for c in CORES for h in POISONS if h != "one-nan" or c == DEFAULT_CORE])
def test_stability_of_a_diverged_checkpoint_counts_nan_and_writes_the_store(healthy: dict[str, Path], tmp_path: Path,
                                                                          core: str, how: str) -> None:
    bad = poison(healthy[core], tmp_path / f"{core}-{how}.pt", how)
    out = tmp_path / "s.zarr"
    outcome = invoke(["stability", bad, "-o", out, *STAB])
    count("diverged", 1)
    assert_clean(outcome, f"{core} {how}")
    assert outcome.rc == 0, outcome.err
    ds = read_store(out, kind="stability")
    nan = int(np.isnan(ds["score_default"].values).sum())
    assert json.loads(ds.attrs["nan_scores"])["default"] == nan
    assert ds.attrs["nonfinite_jacobians"] >= (1 if how != "huge" else 0)
    if how in ("nan", "inf"):  # every Jacobian is non-finite: every score is NaN, none averaged in
        assert nan == ds["score_default"].size
        assert "nan [nan, nan]" in outcome.out
    lines = _warning_lines(outcome.err, how)
    if nan:
        assert len(lines) == 1 and lines[0].startswith("warning: ") and str(nan) in lines[0], outcome.err
        table_nan = [int(ln.split("│")[-2]) for ln in outcome.out.splitlines() if ln.count("│") > 5
                     and ln.split("│")[-2].strip().isdigit()]
        assert sum(table_nan) == nan  # the table's NaN column counts them too
    assert not leftovers(tmp_path)


@pytest.mark.parametrize("core,how", [(c, h) for c in CORES for h in ("nan", "inf")] + [(OTHER_CORE, "huge")])
def test_dynamics_of_a_diverged_checkpoint_writes_the_store_with_a_warning(healthy: dict[str, Path],
                                                                           tmp_path: Path, core: str, how: str) -> None:
    bad = poison(healthy[core], tmp_path / f"{core}-{how}.pt", how)
    out = tmp_path / "d.zarr"
    outcome = invoke(["dynamics", bad, "-o", out, *DYN])
    count("diverged", 1)
    assert_clean(outcome, f"{core} {how}")
    assert outcome.rc == 0, outcome.err
    ds = read_store(out, kind="dynamics")
    counts = json.loads(ds.attrs["nonfinite_values"])
    if how != "huge":
        assert sum(counts.values()) > 0
    lines = _warning_lines(outcome.err, how)
    if sum(counts.values()):
        assert len(lines) == 1 and lines[0].startswith("warning: "), outcome.err


def test_api_warns_and_counts_and_healthy_checkpoints_are_unaffected(healthy: dict[str, Path], tmp_path: Path) -> None:
    bad = poison(healthy[DEFAULT_CORE], tmp_path / "bad.pt", "nan")
    opts = StabilityOptions(triplets=2, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alone = run_checkpoint_stability([healthy[DEFAULT_CORE]], opts)  # healthy: no warning
    with pytest.warns(DivergedWarning, match="non-finite"):
        both = run_checkpoint_stability([healthy[DEFAULT_CORE], bad], opts)
    assert both.nonfinite_jacobians == 3 * len(both.probes)
    for kind, scores in alone.results[0].result.scores.items():
        assert torch.equal(both.results[0].result.scores[kind], scores)  # bit for bit
        assert bool(both.results[1].result.scores[kind].isnan().all())
    assert both.nan_count["default"] == 2 * len(both.probes)
    with pytest.warns(DivergedWarning):
        dyn = run_checkpoint_dynamics([bad], DynamicsOptions(sequences=1, grid_sequences=1, trajectories=1, steps=12, lyap_warmup=2))
    assert sum(dyn.nonfinite.values()) > 0
