"""Numbers from broken models are flagged (``gradscope.guard``): a NaN or Inf parameter in a gradscope
checkpoint, a parent of ``train --extend-from``, a library model or a model given to
``gradscope.wrap`` is named in a ``warning:`` line before any work (one shared check,
:func:`gradscope.guard.nonfinite_tensors`). How the tables show NaN is in
tests/cli/test_hardening_diverged.py."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import gradscope
from tests.helpers.fuzzkit import assert_clean, invoke
from gradscope.errors import GradscopeError
from gradscope.guard import NonFiniteWeightsWarning, nonfinite_tensors


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small trained checkpoint of the default core (vocabulary 8)."""
    from tests.helpers.runs import DEFAULT_CORE, small_run
    from gradscope.train import train
    run = tmp_path_factory.getbasetemp() / "hardening-runs" / DEFAULT_CORE
    if not (run / "eval.json").exists():
        train(small_run(iterations=5), run)
    return run / "step-0000005.pt"


def one_nan(src: Path, dst: Path, name: str = "core.cell.weight_hh", value: float = float("nan")) -> Path:
    """A copy of checkpoint ``src`` with one entry of the weight ``name`` (matched by its end) set to ``value``."""
    ckpt = torch.load(src, weights_only=True)
    key = next(k for k in ckpt["model"] if k.endswith(name) or name in k)
    ckpt["model"][key].view(-1)[0] = value
    torch.save(ckpt, dst)
    return dst, key


def warnings_of(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("warning: ")]


def _gru_key(healthy: Path) -> str:
    ckpt = torch.load(healthy, weights_only=True)
    return next(k for k, v in ckpt["model"].items() if v.dim() == 2 and not k.startswith("embedding"))


def test_the_shared_check_names_each_nonfinite_tensor_once() -> None:
    lin = torch.nn.Linear(3, 2)
    seq = torch.nn.Sequential(lin, lin)  # one tensor under two names: counted once
    assert nonfinite_tensors(seq) == []
    with torch.no_grad():
        lin.weight[0, 1] = float("inf")
        lin.bias[1] = float("nan")
    assert nonfinite_tensors(seq) == [("0.weight", 1, 6), ("0.bias", 1, 2)]
    seq.register_buffer("counts", torch.tensor([1, 2]))  # integers are never non-finite
    assert len(nonfinite_tensors(seq)) == 2


def test_stability_of_a_checkpoint_with_a_nan_weight_names_it_first(healthy: Path, tmp_path: Path) -> None:
    key = _gru_key(healthy)
    bad, key = one_nan(healthy, tmp_path / "bad.pt", key)
    outcome = invoke(["stability", bad, "-o", tmp_path / "s.zarr", "--triplets", "2", "--resamples", "20", "-q"])
    assert_clean(outcome)
    assert outcome.rc == 0, outcome.err
    lines = warnings_of(outcome.err)
    assert lines and "NaN or Inf weights" in lines[0] and key in lines[0] and str(bad) in lines[0], outcome.err
    healthy_run = invoke(["stability", healthy, "-o", tmp_path / "h.zarr", "--triplets", "2", "--resamples", "20", "-q"])
    assert healthy_run.rc == 0 and not warnings_of(healthy_run.err), healthy_run.err


def test_accuracy_of_an_inf_checkpoint_names_it(healthy: Path, tmp_path: Path) -> None:
    bad, key = one_nan(healthy, tmp_path / "inf.pt", _gru_key(healthy), float("inf"))
    outcome = invoke(["accuracy", bad, "-q", "-o", tmp_path / "inf.zarr"])
    assert outcome.rc == 0, outcome.err
    lines = warnings_of(outcome.err)
    assert len(lines) == 1 and key in lines[0], outcome.err


def test_extending_a_nan_parent_says_so_once_before_training(healthy: Path, tmp_path: Path) -> None:
    parent, key = one_nan(healthy, tmp_path / "parent.pt", _gru_key(healthy))
    outcome = invoke(["train", "-q", "--extend-from", parent, "--vocab-size", "12", "--iterations", "2",
                      "-o", tmp_path / "ext"])
    assert outcome.rc == 0, outcome.err
    lines = warnings_of(outcome.err)
    assert len(lines) == 1 and key in lines[0] and str(parent) in lines[0], outcome.err


def test_the_python_api_warns(healthy: Path, tmp_path: Path) -> None:
    bad, key = one_nan(healthy, tmp_path / "bad.pt", _gru_key(healthy))
    with pytest.warns(NonFiniteWeightsWarning, match=key.replace(".", r"\.")):
        gradscope.load(bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteWeightsWarning)
        gradscope.load(healthy)
    gru = torch.nn.GRU(3, 4, batch_first=True)
    with torch.no_grad():
        gru.weight_hh_l0[0, 0] = float("nan")
    with pytest.warns(NonFiniteWeightsWarning, match="weight_hh_l0"):
        try:
            gradscope.wrap(gru)
        except GradscopeError:
            pass  # a model whose NaN outputs differ in place from the library's is refused; named first


def test_a_library_model_with_a_nan_weight_is_named(runner, tmp_path: Path) -> None:  # noqa: ANN001
    transformers = pytest.importorskip("transformers")
    st = pytest.importorskip("safetensors.torch")
    from tests.helpers import adapterkit
    from gradscope.cli.app import app
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=20, hidden_size=8, state_size=4, num_hidden_layers=2, expand=2,
                                   conv_kernel=3, time_step_rank=2, use_bias=True)
    d = tmp_path / "m"
    transformers.MambaForCausalLM(cfg).save_pretrained(d)
    state = st.load_file(str(d / "model.safetensors"))
    state["backbone.layers.1.mixer.D"][3] = float("nan")
    st.save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    probes = tmp_path / "p.npy"
    np.save(probes, adapterkit.probes(20, 3, 6, 2, seed=6).numpy())
    result = runner.invoke(app, ["stability", str(d), "--model", "hf", "--probes", str(probes), "--target-pos", "2",
                                 "-o", str(tmp_path / "s.zarr"), "-q"])
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith(("warning: ", "error: "))]
    assert lines and lines[0].startswith("warning: ") and "backbone.layers.1.mixer.D (1 of 16)" in lines[0], result.stderr
    # then the work goes on, as for a gradscope checkpoint: NaN scores, counted and said, never blamed on the
    # architecture (the wrap-time check compares the finite outputs and the NaN pattern)
    assert result.exit_code == 0 and not any(ln.startswith("error: ") for ln in lines), result.stderr
    assert (tmp_path / "s.zarr").is_dir()
