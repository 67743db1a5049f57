"""Library models (``models.adapters.load``) are loaded exactly or not at all: a ``save_pretrained`` directory
or a weights file whose tensors do not match the model its config.json builds — missing, extra,
another architecture's, mis-shaped, oversized — is a one-line error that names the tensor (exit 2),
never a model with weights initialised at random; the config's sizes are checked against the memory
budget before anything is allocated; half precision is loaded as float32. The weight files' own checks
(truncated files, lying headers, shards) are in tests/models/adapters/test_weights.py.
Tiny transformers models, saved in tmp dirs; nothing is downloaded."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.helpers import adapterkit
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from gradscope.cli.app import app  # noqa: E402
from gradscope.errors import GradscopeError  # noqa: E402
from gradscope.models.adapters.load import load_hf  # noqa: E402
from tests.helpers.hardening import tiny_mamba  # noqa: E402

V = 20


def mamba(tie: bool = True, hidden: int = 8) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=V, hidden_size=hidden, state_size=4, num_hidden_layers=2, expand=2,
                                   conv_kernel=3, time_step_rank=2, use_bias=True, tie_word_embeddings=tie)
    return transformers.MambaForCausalLM(cfg).eval()


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    d = tmp_path / "mamba"
    mamba().save_pretrained(d)
    return d


def weights(d: Path) -> dict[str, torch.Tensor]:
    return safetensors_torch.load_file(str(d / "model.safetensors"))


def rewrite(d: Path, state: dict[str, torch.Tensor]) -> None:
    safetensors_torch.save_file({k: v.contiguous() for k, v in state.items()}, str(d / "model.safetensors"),
                                metadata={"format": "pt"})


def cli(runner, d: Path, tmp_path: Path, *extra: str):  # noqa: ANN001, ANN201
    probes = tmp_path / "p.npy"
    np.save(probes, adapterkit.probes(V, 3, 6, 2, seed=6).numpy())
    return runner.invoke(app, ["stability", str(d), "--model-factory", "hf", "--probes", str(probes), "--target-pos",
                               "2", "-o", str(tmp_path / "out.zarr"), "-q", *extra])


def refused(result, *words: str) -> None:  # noqa: ANN001
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_a_missing_tensor_is_named_not_initialised(saved: Path, runner, tmp_path: Path) -> None:  # noqa: ANN001
    state = weights(saved)
    del state["backbone.layers.1.mixer.A_log"]
    rewrite(saved, state)
    refused(cli(runner, saved, tmp_path), "lacks tensor backbone.layers.1.mixer.A_log")
    assert not (tmp_path / "out.zarr").exists()


def test_another_architectures_weights_are_refused(saved: Path, runner, tmp_path: Path) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    rwkv = transformers.RwkvForCausalLM(transformers.RwkvConfig(vocab_size=V, hidden_size=8, num_hidden_layers=2,
                                                                attention_hidden_size=8, intermediate_size=16))
    rewrite(saved, {k: v for k, v in rwkv.state_dict().items() if k != "head.weight"})
    refused(cli(runner, saved, tmp_path), "rwkv.", "does not have")


def test_an_extra_tensor_is_refused(saved: Path, runner, tmp_path: Path) -> None:  # noqa: ANN001
    state = weights(saved)
    state["backbone.layers.2.mixer.D"] = torch.ones(16)
    rewrite(saved, state)
    refused(cli(runner, saved, tmp_path), "backbone.layers.2.mixer.D")


def test_config_sizes_that_disagree_with_the_weights_name_the_tensor(saved: Path, runner, tmp_path: Path) -> None:  # noqa: ANN001
    cfg = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps({**cfg, "state_size": 5}))
    refused(cli(runner, saved, tmp_path), "shape", "A_log")


def test_a_deeply_nested_config_is_one_line(saved: Path, runner, tmp_path: Path) -> None:  # noqa: ANN001
    (saved / "config.json").write_text('{"architectures": ["MambaForCausalLM"], "x": ' + "[" * 100000 + "]" * 100000 + "}")
    refused(cli(runner, saved, tmp_path), "error: checkpoint:", "config.json", "not JSON")


def test_a_huge_config_is_refused_before_anything_is_allocated(saved: Path, runner, tmp_path: Path) -> None:  # noqa: ANN001
    cfg = json.loads((saved / "config.json").read_text())
    for hidden, empty in ((10**9, False), (8000, True)):
        (saved / "config.json").write_text(json.dumps({**cfg, "hidden_size": hidden}))
        if empty:
            rewrite(saved, {})
        start = time.perf_counter()
        refused(cli(runner, saved, tmp_path), "checkpoint:")
        assert time.perf_counter() - start < 20


def test_the_memory_budget_applies_to_library_models(saved: Path, runner, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """Weights that agree with their config, but more than the budget: refused before the model is built."""
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", "4096")
    refused(cli(runner, saved, tmp_path), "error: checkpoint:", "MambaForCausalLM", "memory")


def test_layer_counts_beyond_the_weights_are_refused_at_once(saved: Path, runner, tmp_path: Path) -> None:  # noqa: ANN001
    cfg = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 10**8}))
    start = time.perf_counter()
    refused(cli(runner, saved, tmp_path), "num_hidden_layers")
    assert time.perf_counter() - start < 20


def test_sharded_weights_load_exactly(saved: Path, tmp_path: Path) -> None:
    """A model saved in shards loads to the very tensors of the model saved in one file."""
    sharded = tmp_path / "sharded"
    mamba().save_pretrained(sharded, max_shard_size="2KB")
    assert (sharded / "model.safetensors.index.json").exists()
    one, many = load_hf("hf", saved), load_hf("hf", sharded)
    for (a, x), (b, y) in zip(one.state_dict().items(), many.state_dict().items()):
        assert a == b and torch.equal(x, y)
    assert many.lm_head.weight is many.backbone.embeddings.weight


def test_untied_weights_are_each_loaded(tmp_path: Path) -> None:
    model = mamba(tie=False)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)  # differs from the embeddings
    model.save_pretrained(tmp_path / "m")
    loaded = load_hf("hf", tmp_path / "m")
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    assert torch.equal(loaded.backbone.embeddings.weight, model.backbone.embeddings.weight)
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_a_weights_file_and_its_config_are_held_to_the_same_rules(saved: Path, runner, tmp_path: Path) -> None:  # noqa: ANN001
    f = saved / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    probes = tmp_path / "p.npy"
    np.save(probes, adapterkit.probes(V, 3, 6, 2, seed=6).numpy())
    result = runner.invoke(app, ["stability", str(f), "--model", "hf:MambaForCausalLM", "--config",
                                 str(saved / "config.json"), "--probes", str(probes), "--target-pos", "2", "-o",
                                 str(tmp_path / "w.zarr"), "-q"])
    refused(result, "truncated")
    pt = tmp_path / "w.pt"
    state = mamba().state_dict()
    del state["backbone.norm_f.weight"]
    torch.save(state, pt)
    with pytest.raises(GradscopeError, match="lacks tensor backbone.norm_f.weight"):
        load_hf("hf:MambaForCausalLM", pt, saved / "config.json")


def test_a_good_directory_scores_and_a_config_note_is_not_a_second_line(saved: Path, runner, tmp_path: Path) -> None:  # noqa: ANN001
    result = cli(runner, saved, tmp_path)
    assert result.exit_code == 0, result.stderr
    cfg = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps({**cfg, "vocab_size": 0}))  # transformers logs notes on it
    refused(cli(runner, saved, tmp_path, "--overwrite"), "backbone.embeddings.weight", "(0, 8)")


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_number_in_the_config_is_refused(saved: Path, value: str) -> None:
    """A NaN epsilon gives NaN outputs that the wrap-time check would blame on the architecture."""
    text = (saved / "config.json").read_text()
    assert '"layer_norm_epsilon": 1e-05' in text
    (saved / "config.json").write_text(text.replace('"layer_norm_epsilon": 1e-05', f'"layer_norm_epsilon": {value}'))
    with pytest.raises(GradscopeError, match="must be finite"):
        load_hf("hf", saved)


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
