"""`gradscope stability`: probes from a .npy file, and bad input, bad probe files and checkpoints and an
existing store refused in one line (SPEC §4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gradscope.cli.app import app
from gradscope.store import read_store


def _invoke(runner: CliRunner, *args: str) -> "object":
    return runner.invoke(app, ["stability", *map(str, args), "-q", "--resamples", "200"])


def test_npy_probes(runner: CliRunner, trained_runs: dict, tmp_path: Path) -> None:
    tokens = np.random.default_rng(0).integers(0, 8, size=(5, 3, 4))
    np.save(tmp_path / "p.npy", tokens)
    result = _invoke(runner, trained_runs["dual"] / "step-0000030.pt", "--probes", tmp_path / "p.npy",
                     "-o", tmp_path / "s.zarr")
    assert result.exit_code == 0, result.stderr
    assert "file/file" in result.stdout


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


def test_the_table_shows_no_iteration_for_a_model_without_one() -> None:
    """A library or factory model has no training iteration (-1 in the store): the table shows '–', as dynamics'."""
    from rich.console import Console

    from gradscope.analysis.bootstrap import bootstrap_mean
    from gradscope.cli.stability import stability_table
    from gradscope.workflows.stability import SummaryRow

    iv = bootstrap_mean(np.array([0.5, 0.7, 0.9]), resamples=50)
    rows = [SummaryRow(it, "run", "rare/all", pair, iv, checkpoint=k) for k, it in enumerate((-1, 600))
            for pair in ("same-target", "same-suffix")]
    console = Console(width=200, record=True)
    console.print(stability_table(rows, "default", 50))
    lines = [line for line in console.export_text().splitlines() if "rare/all" in line]
    assert [line.split("│")[1].strip() for line in lines] == ["–", "600"]
