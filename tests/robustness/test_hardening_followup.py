"""A hostile pass after issue #36's fixes (library models, corpora, parents, options): each test is a
defect found by trying the CLI and the Python API as a careless or unlucky user would, shown failing
before its fix. Tiny models in tmp dirs; nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.helpers import adapterkit  # noqa: E402

from gradscope.cli.app import app  # noqa: E402
from gradscope.errors import GradscopeError  # noqa: E402

V = 20


def refused(result, *words: str) -> None:  # noqa: ANN001
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    lines = [ln for ln in result.stderr.strip().splitlines() if not ln.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def tiny_mamba() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=V, hidden_size=8, state_size=4, num_hidden_layers=2, expand=2,
                                   conv_kernel=3, time_step_rank=2, use_bias=True)
    return transformers.MambaForCausalLM(cfg).eval()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_library_model_is_analysed_in_float32(tmp_path: Path, runner, dtype: str) -> None:  # noqa: ANN001
    """A save_pretrained directory in half precision (most published checkpoints) gave a traceback
    ("linalg_svd_cpu" not implemented for 'Half', exit 1) in stability, and dynamics the same in eig.
    It is loaded in float32 (every half value is exact there), as the analyses need."""
    d = tmp_path / "m"
    tiny_mamba().to(getattr(torch, dtype)).save_pretrained(d)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg.get("dtype", cfg.get("torch_dtype")) == dtype
    probes = tmp_path / "p.npy"
    np.save(probes, adapterkit.probes(V, 3, 6, 2, seed=6).numpy())
    out = tmp_path / "s.zarr"
    result = runner.invoke(app, ["stability", str(d), "--model-factory", "hf", "--probes", str(probes), "--target-pos", "2",
                                 "-o", str(out), "-q", "--resamples", "100"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert out.is_dir()


def test_wrap_refuses_a_half_precision_model_in_one_line() -> None:
    """gradscope.wrap on a float16 model wrapped it, then every analysis failed deep inside torch."""
    import gradscope

    with pytest.raises(GradscopeError, match=r"float16.*model\.float\(\)"):
        gradscope.wrap(tiny_mamba().half())
    with pytest.raises(GradscopeError, match=r"bfloat16"):
        gradscope.wrap(torch.nn.GRU(3, 4, batch_first=True).to(torch.bfloat16))


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


def test_vocab_on_the_continuous_task_is_refused_not_recorded(tmp_path: Path, runner) -> None:  # noqa: ANN001
    """`train --task reverse-continuous --dim 4 --vocab 5` trained (its width is --dim) and recorded
    vocab_size 5 in config.json: an option accepted, ignored and recorded."""
    out = tmp_path / "r"
    result = runner.invoke(app, ["train", "--task", "reverse-continuous", "--dim", "4", "--vocab-size", "5", "--iterations",
                                 "2", "--checkpoint-every", "2", "-o", str(out), "-q"])
    refused(result, "--vocab-size", "--dim")
    assert not out.exists()
    from gradscope.presets import build_config

    with pytest.raises(GradscopeError, match="vocab_size"):
        build_config("tiny", {"task": "reverse-continuous", "dim": 4, "vocab_size": 5})
    assert build_config("tiny", {"task": "reverse-continuous", "dim": 4}).model.vocab_size == 4


def test_a_manifest_format_version_as_a_string_is_named_as_one(tmp_path: Path) -> None:
    """A manifest whose format_version is the string "1" was refused as "has format_version 1; this
    gradscope reads version 1"."""
    from gradscope.corpus.store import _manifest

    d = tmp_path / "c"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"format": "gradscope-corpus", "format_version": "1"}))
    with pytest.raises(GradscopeError, match=r"format_version '1'; this gradscope reads version 1"):
        _manifest(d)


def test_a_plain_gru_with_a_nan_weight_is_flagged_not_blamed_on_its_architecture() -> None:
    """A plain nn.GRU with one NaN weight was named in a warning, then refused as "disagree by nan ... the
    module is not a standard GRU"; library models were already scored and flagged (issue #36)."""
    import gradscope
    from gradscope.guard import NonFiniteWeightsWarning

    gru = torch.nn.GRU(3, 4, batch_first=True)
    with torch.no_grad():
        gru.weight_hh_l0[0, 0] = float("nan")
    with pytest.warns(NonFiniteWeightsWarning, match="weight_hh_l0"):
        model = gradscope.wrap(gru)
    assert model.core.state_dim == 4
