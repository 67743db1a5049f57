"""The shipped sample_checkpoints/: manifest hashes, loading, sizes (issue #6)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import gradscope
from gradscope.errors import GradscopeError
from gradscope.train import train

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"


def _manifest() -> dict:
    return json.loads((SAMPLES / "MANIFEST.json").read_text())


def test_manifest_hashes_match_every_file() -> None:
    manifest = _manifest()
    assert manifest["format"] == "gradscope-samples"
    listed = set()
    for run in manifest["runs"]:
        for name, digest in run["files"].items():
            path = SAMPLES / run["run"] / name
            assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, path
            listed.add(path)
    on_disk = {p for p in SAMPLES.rglob("*") if p.is_file() and p.name not in ("MANIFEST.json", "README.md")}
    assert on_disk == listed


def test_every_sample_checkpoint_loads_within_size_limits() -> None:
    total = 0
    cores = set()
    for run in _manifest()["runs"]:
        ckpts = sorted((SAMPLES / run["run"]).glob("step-*.pt"))
        assert len(ckpts) >= 3, "a few intermediate checkpoints show stability over training"
        for ckpt in ckpts:
            assert ckpt.stat().st_size <= 2 * 1024 * 1024
            loaded = gradscope.load(ckpt)
            assert loaded.raw["stripped"] and loaded.config.train.seed == run["seed"]
            assert loaded.heldout.grid is not None
        cores.add((run["config"]["model"]["core"], run["config"]["model"]["pe"]))
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file())
    assert total <= 30_000_000  # the folder stays <= 30 MB (issue #26)
    assert cores == {(c, pe) for c in ("gru", "lstm", "s4d", "mingru", "mamba") for pe in ("none", "sinusoidal")}


def test_a_stripped_sample_cannot_be_resumed(tmp_path: Path) -> None:
    import shutil
    run = _manifest()["runs"][0]["run"]
    copy = tmp_path / run
    shutil.copytree(SAMPLES / run, copy)
    (copy / "eval.json").unlink()
    cfg = gradscope.load(copy).config
    with pytest.raises(GradscopeError, match="stripped sample"):
        train(cfg, copy, resume=True)
