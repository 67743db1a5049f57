"""Packaging runs as shipped sample checkpoints (sample_checkpoints/, issue #6).

A sample is a copy of a run directory whose checkpoints keep everything analysis needs (configs,
weights, held-out data, iteration, metrics) but drop the optimizer state, which would double their
size, and store held-out token ids as int16; they are marked ``"stripped": True`` and cannot be resumed. ``MANIFEST.json`` lists every
sample with its config, command, seed, held-out accuracy and the sha256 of every file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from gradscope.errors import check
from gradscope.files.checkpoint import list_checkpoints, validate_checkpoint
from gradscope.files.io import atomic_save, atomic_write_text, safe_load, sha256_file
from gradscope.files.rundir import CONFIG_FILE, EVAL_FILE, METRICS_FILE, read_evaluation, read_json, read_run_config

MANIFEST = "MANIFEST.json"


def _narrow(t: torch.Tensor | None) -> torch.Tensor | None:
    """Token ids as int16 when they fit (they do for K < 32767): a quarter of the int64 size."""
    if t is None or t.numel() == 0 or int(t.max()) >= 2**15 or int(t.min()) < -(2**15):
        return t
    return t.to(torch.int16)


def strip_checkpoint(src: Path, dst: Path) -> None:
    """Copy a gradscope checkpoint without its optimizer state, held-out ids narrowed (atomically)."""
    ckpt = safe_load(src)
    _, source = validate_checkpoint(ckpt, src)
    check(source == "gradscope", f"sample: {src} is not a gradscope checkpoint")
    ckpt["optimizer"] = {}
    ckpt["stripped"] = True
    ckpt["heldout"] = {k: _narrow(v) for k, v in ckpt["heldout"].items()}
    atomic_save(ckpt, dst)


def package_run(run_dir: Path, dest: Path) -> dict[str, Any]:
    """Copy one finished run into ``dest`` (stripped checkpoints); returns its manifest entry."""
    check((run_dir / EVAL_FILE).exists(), f"sample: {run_dir} has not finished training (no {EVAL_FILE})")
    dest.mkdir(parents=True, exist_ok=True)
    for name in (CONFIG_FILE, METRICS_FILE, EVAL_FILE):
        shutil.copyfile(run_dir / name, dest / name)
    for ckpt in list_checkpoints(run_dir):
        strip_checkpoint(ckpt, dest / ckpt.name)
    read_run_config(run_dir)  # validated: a sample must load
    config = read_json(run_dir / CONFIG_FILE, "sample")
    evaluation = read_evaluation(run_dir)
    return {"run": dest.name, "config": config["config"], "command": config["command"],
            "seed": config["config"]["train"]["seed"], "heldout": evaluation,
            "files": {p.name: sha256_file(p) for p in sorted(dest.iterdir())}}


def write_samples_manifest(root: Path, entries: list[dict[str, Any]]) -> Path:
    """Atomically (re)write ``root/MANIFEST.json``, the index of shipped samples (:func:`package_run` entries)."""
    atomic_write_text(root / MANIFEST, json.dumps({"format": "gradscope-samples", "runs": entries}, indent=1) + "\n")
    return root / MANIFEST
