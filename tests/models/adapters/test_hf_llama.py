"""gradscope.wrap(transformers LlamaForCausalLM / Qwen3ForCausalLM): a pure transformer whose state is its
attention caches, against a float64 brute force through transformers' own forward and KV cache
(tests/helpers/adapterkit.py): the state Jacobian over keys and values at positions ≤ p, S(A, A) = 1 and its
invariance to a permutation of the state, and the dynamics parts it does and does not define (issue #49)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from gradscope.errors import GradscopeError  # noqa: E402
from tests.helpers.adapterkit import (Family, check_gradient_flow, check_stability,  # noqa: E402
                                      check_state_jacobian, hybrid_family)

B, T, V = 2, 6, 30
RTOL = 2e-6  # transformers runs its RMSNorms and softmax in float32 even for a float64 model
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, POSITIONS = 16, 2, 4, 2, 4, 10


def tiny(kind: str = "llama", bare: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(vocab_size=V, hidden_size=HIDDEN, intermediate_size=24, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                  max_position_embeddings=64, attn_implementation="eager")
    if kind == "llama":
        cls = transformers.LlamaModel if bare else transformers.LlamaForCausalLM
        model = cls(transformers.LlamaConfig(**common, attention_bias=True)).eval()
    else:
        cls = transformers.Qwen3Model if bare else transformers.Qwen3ForCausalLM
        model = cls(transformers.Qwen3Config(**common)).eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(10)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5, generator=gen)
            elif "bias" in name:
                p.normal_(0.0, 0.2, generator=gen)
    return model.double()


def family(model: torch.nn.Module) -> Family:
    """The KV cache in the documented layout (tests/helpers/adapterkit.hybrid_family): per layer keys, values
    (positions, H_kv, d), zero beyond the tokens read."""
    return hybrid_family(model, ["full_attention"] * LAYERS, POSITIONS)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_state_jacobian_over_keys_and_values_matches_the_library_cache(kind: str) -> None:
    model = tiny(kind)
    wrapped = gradscope.wrap(model, positions=POSITIONS)
    core = wrapped.core
    assert core.family == ("Llama" if kind == "llama" else "Qwen3")
    assert core.state_dim == LAYERS * 2 * POSITIONS * KV_HEADS * HEAD_DIM
    assert all(b.held for b in core.jacobian_structure().blocks)
    fam = family(model)
    for p, method in ((1, "vjp"), (3, "func"), (T - 1, "auto")):
        check_state_jacobian(fam, wrapped, tokens(1), p, method, RTOL)
    check_stability(fam, wrapped, L=5, p=2, rtol=1e-6)


def test_scores_are_one_with_itself_ignore_the_states_order_and_the_flow_matches() -> None:
    from gradscope.analysis.scores import default_score

    model = tiny()
    wrapped = gradscope.wrap(model, positions=POSITIONS)
    jac = gradscope.state_jacobian(wrapped, tokens(5), position=3).jac
    same = default_score(jac, jac)
    assert torch.allclose(same, torch.ones_like(same), rtol=0, atol=1e-12)
    other = gradscope.state_jacobian(wrapped, tokens(6), position=3).jac
    perm = torch.randperm(jac.shape[-1], generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(default_score(jac[..., perm], other[..., perm]), default_score(jac, other),
                               rtol=1e-12, atol=1e-14)
    check_gradient_flow(family(model), wrapped, tokens(2), rtol=RTOL)


def test_the_bare_model() -> None:
    bare = tiny(bare=True)
    wrapped = gradscope.wrap(bare, positions=POSITIONS)
    assert wrapped.readout is None
    check_state_jacobian(family(bare), wrapped, tokens(4), 2, "vjp", RTOL)


def test_dynamics_runs_the_flow_and_grid_and_refuses_the_step_parts_in_one_line(runner, tmp_path) -> None:  # noqa: ANN001
    import xarray as xr

    from gradscope.cli.app import app

    tiny().float().save_pretrained(tmp_path / "llama")
    out = tmp_path / "d.zarr"
    result = runner.invoke(app, ["dynamics", str(tmp_path / "llama"), "--model-factory", "hf", "--sequences", "2",
                                 "--length", "8", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    ds = xr.open_zarr(out)
    assert "flow_fro" in ds and "lyapunov" not in ds and "step_radius" not in ds
    result = runner.invoke(app, ["dynamics", str(tmp_path / "llama"), "--model-factory", "hf", "--length", "8",
                                 "--parts", "lyapunov", "-o", str(tmp_path / "e.zarr"), "-q"])
    assert result.exit_code == 2
    assert "not defined for a Llama transformer" in result.stderr and result.stderr.count("\n") <= 2
    with pytest.raises(GradscopeError, match="holds 10 positions"):
        gradscope.state_jacobian(gradscope.wrap(tiny(), positions=POSITIONS), tokens(1, length=11), position=2)
