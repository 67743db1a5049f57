"""The stability pipeline through `gradscope stability` (SPEC §4): its store against the library's
scores, and the complex-state core's Wirtinger real part equal to its real-view score."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from typer.testing import CliRunner

import gradscope
from gradscope.analysis.stability import probe_stability
from gradscope.store import read_store
from gradscope.tasks.probes import make_probes

from tests.cli.test_stability import _invoke


def test_cli_over_training_and_store_round_trip(runner: CliRunner, trained_runs: dict, tmp_path: Path) -> None:
    out = tmp_path / "s.zarr"
    result = _invoke(runner, trained_runs["dual"], "--triplets", "6", "--target-pos", "2", "-o", out)
    assert result.exit_code == 0, result.stderr
    assert "rare/rare" in result.stdout and "same-suffix" in result.stdout
    ds = read_store(out, kind="stability")
    assert ds.sizes == {"checkpoint": 3, "pair": 2, "triplet": 24, "member": 3, "sv": 16, "position": 4}
    assert ds["iteration"].values.tolist() == [10, 20, 30]
    assert len(set(ds["sha256"].values.tolist())) == 3
    assert ds.attrs["target_position"] == 2 and "gradscope stability" in ds.attrs["command"]
    # the stored scores are what the library computes, with the independent torch.func engine
    loaded = gradscope.load(trained_runs["dual"] / "step-0000030.pt")
    probes = make_probes(6, 4, 2, 8, [("frequent", "frequent"), ("frequent", "rare"), ("rare", "frequent"),
                                       ("rare", "rare")], seed=0)
    assert np.array_equal(ds["probe_tokens"].values, probes.tokens.numpy())
    ref = probe_stability(loaded.model.double(), probes, 2, method="func")
    np.testing.assert_allclose(ds["score_default"].values[-1], ref.scores["default"].numpy(), atol=1e-4)
    np.testing.assert_allclose(ds["fro_a"].values[-1], ref.stats["fro_a"].numpy(), rtol=1e-4)
    assert bool((ds["score_default"] <= ds["cos_max"] + 1e-9).all())


def test_s4d_wirtinger_real_part_equals_real_view_score(runner: CliRunner, trained_runs: dict,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "s4d.zarr"
    assert _invoke(runner, trained_runs["complex"], "--triplets", "3", "-o", out).exit_code == 0
    ds = read_store(out)
    np.testing.assert_allclose(ds["wirtinger_real"].values, ds["score_default"].values, atol=1e-6)
    assert np.isfinite(ds["wirtinger_imag"].values).all()
