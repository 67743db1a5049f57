"""Probes, the stability pipeline, its store and `gradscope stability` (SPEC §4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from typer.testing import CliRunner

import gradscope
from gradscope.analysis.stability import probe_stability
from gradscope.cli.app import app
from gradscope.errors import GradscopeError
from gradscope.store import read_store, write_store
from gradscope.tasks.probes import make_probes, make_triplets, vocabulary_groups


def test_triplet_structure() -> None:
    L, p, K = 7, 3, 10
    t = make_triplets(200, L, p, vocabulary_groups(K), "rare", "frequent", torch.Generator().manual_seed(0))
    base, same_target, same_suffix = t[:, 0], t[:, 1], t[:, 2]
    i = p - 1
    assert torch.equal(base[:, :p], same_target[:, :p])  # shares prefix and target
    assert torch.equal(base[:, p:], same_suffix[:, p:])  # shares the suffix
    assert bool((base[:, i] != same_suffix[:, i]).all())  # a different target
    assert (base[:, p:] != same_target[:, p:]).any(dim=1).float().mean() > 0.95
    assert (base[:, :i] != same_suffix[:, :i]).any(dim=1).float().mean() > 0.95
    assert bool((t[:, :, i] >= 5).all())  # rare targets
    mask = torch.ones(L, dtype=torch.bool)
    mask[i] = False
    assert bool((t[:, :, mask] < 5).all())  # frequent disturbants


def test_probes_are_balanced_and_seeded() -> None:
    conds = [("frequent", "rare"), ("rare", "rare")]
    a = make_probes(5, 6, 2, 8, conds, seed=3)
    assert len(a) == 10 and a.conditions == ("frequent/rare",) * 5 + ("rare/rare",) * 5
    assert torch.equal(a.tokens, make_probes(5, 6, 2, 8, conds, seed=3).tokens)
    assert not torch.equal(a.tokens, make_probes(5, 6, 2, 8, conds, seed=4).tokens)
    with pytest.raises(GradscopeError, match="position: got 7"):
        make_probes(5, 6, 7, 8, conds, seed=3)


def _invoke(runner: CliRunner, *args: str) -> "object":
    return runner.invoke(app, ["stability", *map(str, args), "-q", "--resamples", "200"])


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


def test_probes_can_be_replayed_from_a_store(runner: CliRunner, trained_runs: dict, tmp_path: Path) -> None:
    first, second = tmp_path / "a.zarr", tmp_path / "b.zarr"
    ckpt = trained_runs["dual"] / "step-0000030.pt"
    assert _invoke(runner, ckpt, "--triplets", "4", "--seed", "9", "-o", first).exit_code == 0
    result = _invoke(runner, trained_runs["other"], "--probes", first, "-o", second)
    assert result.exit_code == 0, result.stderr
    a, b = xr.open_zarr(first, consolidated=False), xr.open_zarr(second, consolidated=False)
    assert np.array_equal(a["probe_tokens"].values, b["probe_tokens"].values)
    assert list(a["condition"].values) == list(b["condition"].values)
    # the same command twice gives the same numbers
    third = tmp_path / "c.zarr"
    assert _invoke(runner, ckpt, "--triplets", "4", "--seed", "9", "-o", third).exit_code == 0
    c = xr.open_zarr(third, consolidated=False)
    assert np.array_equal(a["score_default"].values, c["score_default"].values)


def test_npy_probes(runner: CliRunner, trained_runs: dict, tmp_path: Path) -> None:
    tokens = np.random.default_rng(0).integers(0, 8, size=(5, 3, 4))
    np.save(tmp_path / "p.npy", tokens)
    result = _invoke(runner, trained_runs["dual"] / "step-0000030.pt", "--probes", tmp_path / "p.npy",
                     "-o", tmp_path / "s.zarr")
    assert result.exit_code == 0, result.stderr
    assert "file/file" in result.stdout


def test_s4d_wirtinger_real_part_equals_real_view_score(runner: CliRunner, trained_runs: dict,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "s4d.zarr"
    assert _invoke(runner, trained_runs["complex"], "--triplets", "3", "-o", out).exit_code == 0
    ds = read_store(out)
    np.testing.assert_allclose(ds["wirtinger_real"].values, ds["score_default"].values, atol=1e-6)
    assert np.isfinite(ds["wirtinger_imag"].values).all()


@pytest.mark.parametrize("args, message", [
    (["--target-freq", "rare"], "uniform vocabulary"),
    (["--target-pos", "0"], "--target-pos: got 0"),
    (["--target-pos", "5"], "valid positions are 1…4"),
    (["--target-freq", "often"], "--target-freq: got 'often'"),
    (["--triplets", "0"], "--triplets: got 0"),
    (["--score", "cosine"], "--score: got 'cosine'"),
    (["--device", "cuda:3"], "device"),
])
def test_bad_input_is_a_one_line_error(runner: CliRunner, trained_runs: dict, tmp_path: Path, args: list,
                                       message: str) -> None:
    result = _invoke(runner, trained_runs["uniform"], *args, "-o", tmp_path / "s.zarr")
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "s.zarr").exists()


def test_bad_probe_files_and_checkpoints(runner: CliRunner, trained_runs: dict, tmp_path: Path) -> None:
    ckpt = trained_runs["dual"] / "step-0000030.pt"
    np.save(tmp_path / "shape.npy", np.zeros((4, 2, 4), dtype=np.int64))
    np.save(tmp_path / "vocab.npy", np.full((4, 3, 4), 99, dtype=np.int64))
    np.save(tmp_path / "length.npy", np.zeros((4, 3, 6), dtype=np.int64))
    (tmp_path / "junk.npy").write_bytes(b"junk")
    for name, message in [("shape", "expected (n, 3"), ("vocab", "vocabulary is 0…7"), ("length", "L = 4"),
                          ("junk", "cannot read")]:
        result = _invoke(runner, ckpt, "--probes", tmp_path / f"{name}.npy", "-o", tmp_path / "s.zarr")
        assert result.exit_code == 2 and message in result.stderr, (name, result.stderr)
    (tmp_path / "bad.pt").write_bytes(ckpt.read_bytes()[:200])
    result = _invoke(runner, tmp_path / "bad.pt", "-o", tmp_path / "s.zarr")
    assert result.exit_code == 2 and "cannot read" in result.stderr


def test_existing_store_is_kept_unless_overwrite(runner: CliRunner, trained_runs: dict, tmp_path: Path) -> None:
    out = tmp_path / "s.zarr"
    ckpt = trained_runs["dual"] / "step-0000030.pt"
    assert _invoke(runner, ckpt, "--triplets", "2", "-o", out).exit_code == 0
    again = _invoke(runner, ckpt, "--triplets", "2", "-o", out)
    assert again.exit_code == 2 and "already exists" in again.stderr
    assert _invoke(runner, ckpt, "--triplets", "3", "-o", out, "--overwrite").exit_code == 0
    assert read_store(out).sizes["triplet"] == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]


def test_store_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = xr.Dataset({"x": ("a", np.arange(3))}, attrs={"kind": "stability"})
    write_store(good, tmp_path / "s.zarr")

    def explode(self: xr.Dataset, store: Path, **kwargs: object) -> None:
        (Path(store) / "zarr.json").write_text("{")  # a half-written store …
        raise KeyboardInterrupt  # … then the run is killed

    monkeypatch.setattr(xr.Dataset, "to_zarr", explode)
    with pytest.raises(KeyboardInterrupt):
        write_store(good, tmp_path / "s.zarr", overwrite=True)
    with pytest.raises(KeyboardInterrupt):
        write_store(good, tmp_path / "new.zarr")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]  # no half store, no temp dirs
    monkeypatch.undo()
    assert read_store(tmp_path / "s.zarr")["x"].values.tolist() == [0, 1, 2]


def test_chunk_shrinks_to_the_memory_budget() -> None:
    from gradscope.analysis.stability import triplets_per_chunk
    from gradscope.config import ModelConfig
    from gradscope.models import SeqModel
    s4d = SeqModel(ModelConfig(core="s4d", vocab_size=4, embed_size=4, hidden_size=8, core_config={"state_size": 16}))
    per_triplet = 3 * 8 * (8 * 16) * 4  # 3 Jacobians of D_out × D float32 values
    assert triplets_per_chunk(s4d, 32, 10 * per_triplet) == 10
    assert triplets_per_chunk(s4d, 32, 1) == 1
    assert triplets_per_chunk(s4d, 4, 1 << 30) == 4


def test_precomputed_svd_gives_the_same_statistics() -> None:
    from gradscope.analysis.scores import companion_stats
    g = torch.Generator().manual_seed(5)
    ja, jb = torch.randn(4, 2, 6, 9, generator=g, dtype=torch.float64), torch.randn(4, 2, 6, 9, generator=g,
                                                                                       dtype=torch.float64)
    ya, yb = torch.randn(4, 2, 6, generator=g, dtype=torch.float64), torch.randn(4, 2, 6, generator=g,
                                                                                 dtype=torch.float64)
    svd = lambda j: tuple(torch.linalg.svd(j, full_matrices=False)[:2])  # noqa: E731
    plain = companion_stats(ja, jb, ya, yb)
    reused = companion_stats(ja, jb, ya, yb, svd_a=svd(ja), svd_b=svd(jb))
    for name in plain:
        torch.testing.assert_close(plain[name], reused[name], equal_nan=True)
