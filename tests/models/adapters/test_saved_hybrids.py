"""The hybrids with attention as state from a saved directory, as a user runs them: ``save_pretrained``,
gradscope's loader (:mod:`gradscope.models.adapters.load`: the weights read back exactly, a MoE block's experts
stacked back as the model holds them, and every other renaming transformers' own conversion applies), then ``gradscope stability DIR --model-factory hf`` from the CLI, whose
scores must equal the same scores from the Python API on the model in memory (issue #49)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.helpers.adapterkit import probes  # noqa: E402

# test module → what its tiny() takes for the variant with the most parts (MoE blocks where the family has them)
FAMILIES = {
    "test_hf_bamba": {},
    "test_hf_nemotron_h": "moe",
    "test_hf_falcon_h1": {},
    "test_hf_jamba": {},
    "test_hf_zamba2": {"mem_blocks": 2},
    "test_hf_kimi_linear": {},  # saved under Moonshot's original names, converted back as transformers does
}


def _tiny(name: str) -> tuple[torch.nn.Module, int]:
    mod = importlib.import_module(f"tests.models.adapters.{name}")
    extra = FAMILIES[name]
    model = mod.tiny(pattern="M*EM", **mod.MOE) if extra == "moe" else mod.tiny(**extra)
    return model.float(), int(mod.V)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_saved_hybrid_loads_exactly_and_runs_from_the_cli(name: str, runner, tmp_path) -> None:  # noqa: ANN001
    import xarray as xr

    import gradscope
    from gradscope.cli.app import app
    from gradscope.models.adapters.load import load_hf
    from gradscope.workflows.api import stability

    model, vocab = _tiny(name)
    if hasattr(model.config, "_experts_implementation"):
        model.config._experts_implementation = "eager"
    model.save_pretrained(tmp_path / "m")
    loaded = load_hf("hf", tmp_path / "m")
    want = model.state_dict()
    assert set(loaded.state_dict()) == set(want)
    assert all(torch.equal(v, want[k]) for k, v in loaded.state_dict().items())
    tokens = probes(vocab, 3, 6, 2, seed=6)
    np.save(tmp_path / "p.npy", tokens.numpy())
    out = tmp_path / "s.zarr"
    result = runner.invoke(app, ["stability", str(tmp_path / "m"), "--model-factory", "hf", "--probes",
                                 str(tmp_path / "p.npy"), "--target-pos", "2", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    cli = xr.open_zarr(out)["score_default"].values
    api = stability(gradscope.wrap(model, positions=6), probes=tokens, target_pos=2)["score_default"].values
    assert np.isfinite(cli).all()
    np.testing.assert_allclose(cli, api, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("damage", ["an expert missing", "a ragged expert"])
def test_a_damaged_set_of_experts_is_refused_in_one_line(damage: str, tmp_path) -> None:  # noqa: ANN001
    """A MoE block's experts with one expert's tensor gone, or of another shape, are refused before anything is
    built: one GradscopeError line naming the tensor."""
    from safetensors.torch import load_file, save_file

    from gradscope.errors import GradscopeError
    from gradscope.models.adapters.load import load_hf

    model, _ = _tiny("test_hf_jamba")
    model.save_pretrained(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    state = load_file(weights)
    key = next(k for k in sorted(state) if ".experts.1." in k and k.endswith("up_proj.weight"))
    if damage == "an expert missing":
        del state[key]
    else:
        state[key] = torch.zeros(state[key].shape[0] + 1, state[key].shape[1])
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(GradscopeError) as err:
        load_hf("hf", tmp_path / "m")
    message = str(err.value)
    assert "\n" not in message and "experts" in message and str(tmp_path / "m") in message


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_flow_grid_and_lyapunov_run_on_every_hybrid_with_its_caches_held(name: str) -> None:
    """dynamics' flow and (t, T) grid on the whole state and the Lyapunov spectrum on the recurrent layers' own
    (the caches held, named in the store): one exponent a recurrent entry, none for a cache."""
    import gradscope
    from gradscope.analysis.held import held_blocks
    from gradscope.workflows.dynamics import DynamicsOptions, run_model_dynamics

    model, vocab = _tiny(name)
    wrapped = gradscope.wrap(model.double(), positions=12)
    gen = torch.Generator().manual_seed(3)
    run = run_model_dynamics(wrapped, torch.randint(0, vocab, (2, 5), generator=gen),
                             DynamicsOptions(parts=("flow", "grid", "lyapunov"), trajectories=2, steps=12,
                                             lyap_warmup=2),
                             trajectory_tokens=torch.randint(0, vocab, (2, 12), generator=gen))
    ds = run.to_xarray()
    held = held_blocks(wrapped.core)
    assert ds.attrs["held"] == ", ".join(b.name for b in held)
    assert ds.sizes["exponent"] == wrapped.core.state_dim - sum(b.width for b in held)
    flow = ds["flow_fro"].values[..., :-1]  # k < T (a library core's y_T reads z_{T−1}: no column at k = T)
    assert np.isfinite(flow).all() and (flow > 0).all()
    grid = ds["tT_grid"].values
    assert np.isfinite(grid[~np.isnan(grid)]).all() and (~np.isnan(grid)).any()
