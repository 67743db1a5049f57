"""Measure the wrap-time discrepancy between gradscope's transformers-Mamba adapter and the library's own
forward on random-init models of several depths and widths (the data behind
gradscope.models.adapters.base.agreement_tolerance; docs/models-from-libraries.md).

Per model: the relative discrepancy of the correct adapter (what wrap measures), and of three real
mismatches the check must refuse: one norm with a wrong eps (1e-3 for 1e-5), a residual stream rounded
to bfloat16 (what ignoring residual_in_fp32 does to a half-precision model), and one layer's mixer
running another model's weights. Prints one row per model: depth, width, dtype, seed, the four numbers.

    python bench/wrap_agreement.py [--full]   # --full adds d_model 768 (mamba-130m's width)
"""

from __future__ import annotations

import argparse
import time
import types

import torch
import transformers

from gradscope.models.adapters.base import check_against_library
from gradscope.models.wrap import WrappedModel
from gradscope.models.adapters import hf_mamba

VOCAB = 50280  # mamba-130m's


def build(depth: int, width: int, seed: int, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.MambaConfig(vocab_size=VOCAB, hidden_size=width, num_hidden_layers=depth, state_size=16,
                                   expand=2, conv_kernel=4, layer_norm_epsilon=1e-5, residual_in_fp32=True)
    return transformers.MambaForCausalLM(cfg).eval().to(dtype)


def discrepancy(model: torch.nn.Module, forward=None) -> float:  # noqa: ANN001
    """What wrap_library measures: max |ours − theirs| / max(1, max |theirs|) on its seeded batch."""
    adapted = hf_mamba.adapt(model)
    wrapped = WrappedModel(adapted.core, adapted.inputs, adapted.readout, "bench")
    example = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    return check_against_library(wrapped, forward or adapted.forward, example, float("inf"), "bench")


def with_patch(model: torch.nn.Module, target: torch.nn.Module, forward) -> float:  # noqa: ANN001
    old = target.forward
    target.forward = types.MethodType(forward, target)
    try:
        return discrepancy(model)
    finally:
        target.forward = old


def wrong_eps(self, h):  # noqa: ANN001, ANN201
    return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-3))


def bf16_residual(self, hidden_states, cache_params=None, attention_mask=None, **kw):  # noqa: ANN001, ANN201
    residual = hidden_states
    h = self.norm(hidden_states)
    h = self.mixer(h, cache_params=cache_params, attention_mask=attention_mask)
    return (residual.to(torch.bfloat16) + h.to(torch.bfloat16)).to(residual.dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true",
                        help="also d_model 768 at 4, 12 and 24 layers (mamba-130m's width)")
    full = parser.parse_args().full
    rows = []
    grid = [(d, w) for w in (16, 64, 256) for d in (1, 2, 4, 8, 16, 24)]
    if full:
        grid += [(d, 768) for d in (4, 12, 24)]
    print(f"{'depth':>5} {'width':>5} {'dtype':>8} {'seed':>4} {'correct':>9} {'norm_eps':>9} {'bf16_res':>9} "
          f"{'other_w':>9} {'s':>5}", flush=True)
    for depth, width in grid:
        for dtype in (torch.float32, torch.float64):
            seeds = (0, 1, 2) if width <= 256 else (0,)
            if dtype == torch.float64 and width == 768:
                continue
            for seed in seeds:
                t0 = time.perf_counter()
                model = build(depth, width, seed, dtype)
                ok = discrepancy(model)
                layers = model.backbone.layers
                eps = with_patch(model, layers[depth // 2].norm, wrong_eps)
                res = with_patch(model, layers[depth // 2], bf16_residual)
                other = build(1, width, seed + 100, dtype).backbone.layers[0].mixer
                mix = with_patch(model, layers[depth // 2].mixer, lambda self, *a, **k: other(*a, **k))
                dt = time.perf_counter() - t0
                print(f"{depth:5d} {width:5d} {str(dtype)[6:]:>8} {seed:4d} {ok:9.2e} {eps:9.2e} {res:9.2e} "
                      f"{mix:9.2e} {dt:5.1f}", flush=True)
                rows.append((depth, width, dtype, ok))


if __name__ == "__main__":
    main()
