"""The wrap-time agreement check of library models (issue #37, part 3): its tolerance scales with the
model's depth and dtype from the measured float32 error model (adapters.base.agreement_tolerance), the
same on the Python and the CLI path, and real architecture mismatches are still refused at a small
depth and at 24 layers (a small d_model keeps the deep model fast)."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from gradscope.errors import GradscopeError  # noqa: E402
from gradscope.models.adapters import hf_mamba  # noqa: E402
from gradscope.models.adapters.base import agreement_tolerance  # noqa: E402

V = 40


def mamba(depth: int, width: int = 16, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.MambaConfig(vocab_size=V, hidden_size=width, num_hidden_layers=depth, state_size=4, expand=2,
                                   conv_kernel=4, layer_norm_epsilon=1e-5, residual_in_fp32=True)
    return transformers.MambaForCausalLM(cfg).eval()


def test_tolerance_follows_the_measured_error_model() -> None:
    f32, f64 = torch.float32, torch.float64
    eps = torch.finfo(f32).eps
    assert agreement_tolerance(24, f32) == pytest.approx(48 * eps * 24 ** 1.5)
    # the measured worst case (d_model 768, 24 layers, docs/models-from-libraries.md) lies 3× inside
    assert 2.13e-4 * 3 <= agreement_tolerance(24, f32, 1e-4) <= 1e-3
    assert agreement_tolerance(2, f32, 1e-4) == 1e-4  # small models keep the adapter's stated floor
    assert agreement_tolerance(48, f32) == pytest.approx(agreement_tolerance(24, f32) * 2 ** 1.5)
    assert agreement_tolerance(24, f64) == agreement_tolerance(24, f32)  # the library rounds to float32 even then
    assert agreement_tolerance(2, torch.bfloat16) == 1e-2  # unmeasured half precision: capped, never vacuous
    with pytest.raises(GradscopeError, match="depth: got 0"):
        agreement_tolerance(0, f32)


def drifted(model: torch.nn.Module, factor: float) -> torch.nn.Module:
    """The library's own forward with its logits scaled by ``factor``: a disagreement of a chosen size."""
    plain = model.forward

    def forward(self, *args, **kwargs):  # noqa: ANN001, ANN202
        out = plain(*args, **kwargs)
        out.logits = out.logits * factor
        return out
    model.forward = types.MethodType(forward, model)
    return model


def test_a_float32_sized_disagreement_passes_at_24_layers_and_is_refused_at_2() -> None:
    deep = gradscope.wrap(drifted(mamba(24), 1 + 3e-4), checks=False)  # what float32 reaches at 24 layers
    assert 2e-4 < deep.library_error < deep.library_tolerance == agreement_tolerance(24, torch.float32, 1e-4)
    with pytest.raises(GradscopeError, match=r"the tolerance of a 2-layer float32 model"):
        gradscope.wrap(drifted(mamba(2), 1 + 3e-4), checks=False)
    explicit = gradscope.wrap(drifted(mamba(2), 1 + 3e-4), checks=False, tolerance=1e-3)
    assert explicit.library_tolerance == 1e-3


def wrong_norm_eps(model: torch.nn.Module) -> None:
    """One mid-depth RMSNorm of the library runs with eps 1e-3 where its config (read by the adapter) says 1e-5."""
    norm = model.backbone.layers[len(model.backbone.layers) // 2].norm
    norm.forward = types.MethodType(
        lambda self, h: self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-3)), norm)


def half_precision_residual(model: torch.nn.Module) -> None:
    """One block keeps its residual stream in bfloat16 (what ignoring residual_in_fp32 does in half precision)."""
    block = model.backbone.layers[len(model.backbone.layers) // 2]

    def forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):  # noqa: ANN001, ANN202
        h = self.mixer(self.norm(hidden_states), cache_params=cache_params, attention_mask=attention_mask)
        return (hidden_states.to(torch.bfloat16) + h.to(torch.bfloat16)).to(hidden_states.dtype)
    block.forward = types.MethodType(forward, block)


def other_weights(model: torch.nn.Module) -> None:
    """One layer's mixer runs with another model's weights (same configuration, another seed)."""
    width = model.config.hidden_size
    other = mamba(1, width, seed=7).backbone.layers[0].mixer
    mixer = model.backbone.layers[len(model.backbone.layers) // 2].mixer
    mixer.forward = types.MethodType(lambda self, *a, **k: other(*a, **k), mixer)


@pytest.mark.parametrize("depth", [2, 24])
@pytest.mark.parametrize("mismatch", [wrong_norm_eps, half_precision_residual, other_weights])
def test_real_mismatches_are_refused_at_small_and_large_depth(depth: int, mismatch) -> None:  # noqa: ANN001
    model = mamba(depth)
    assert gradscope.wrap(model, checks=False).library_error < 1e-6  # the unchanged model agrees
    mismatch(model)
    with pytest.raises(GradscopeError, match="disagree") as err:
        gradscope.wrap(model, checks=False)
    assert f"{depth}-layer float32" in str(err.value) and "\n" not in str(err.value)


def test_the_cli_uses_the_same_tolerance_as_python(runner, tmp_path) -> None:  # noqa: ANN001
    from gradscope.cli.app import app
    from gradscope.workflows.factory import build_model

    model = mamba(24)
    model.save_pretrained(tmp_path / "deep")
    loaded = build_model("hf", tmp_path / "deep")
    assert loaded.library_tolerance == gradscope.wrap(model, checks=False).library_tolerance \
        == agreement_tolerance(24, torch.float32, hf_mamba.TOLERANCE)
    counts = tmp_path / "counts.npy"
    np.save(counts, np.arange(1, V + 1))
    result = runner.invoke(app, ["stability", str(tmp_path / "deep"), "--model", "hf", "--token-counts", str(counts),
                                 "--length", "6", "--triplets", "2", "-o", str(tmp_path / "s.zarr"), "-q"])
    assert result.exit_code == 0, result.stderr
