"""Checks every user core (and every library adapter) passes before gradscope analyses it.

A protocol core is trusted for three things the engines rely on, and each is checked on one small
batch (2–3 sequences, a few steps, k = 4 random cotangent rows, so the cost is a handful of steps):

1. **batched step = per-sample step.** The engines run sequences in batches; a step that mixes
   them (a broadcast over the batch, as transformers' one-token RWKV path does for B > 1) gives
   Jacobians that are silently wrong.
2. **the vjp engine = the func engine.** ``torch.func.vjp`` of the batched step (what ``vjp`` and
   the gradient flow do) against ``vmap`` over sequences of the one-sequence step (what ``func``,
   the generic step Jacobians and the dynamics do), on the same random cotangents.
3. **torch.func can transform the step at all.** In-place updates of captured tensors and legacy
   ``torch.autograd.Function`` s without ``setup_context`` fail inside torch.func; the failure becomes
   one line naming the cause and the way out.

Tolerances: relative to the largest magnitude compared, 1e-4 in float32 (and lower), 1e-9 in
float64. A failure raises :class:`~gradscope.errors.GradscopeError` naming the check.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.func import vjp, vmap

from gradscope.errors import GradscopeError
from gradscope.guard import same_nonfinite
from gradscope.models.core import initial_state, step_at


def tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of the protocol checks for a core running in ``dtype``."""
    return 1e-9 if dtype == torch.float64 else 1e-4


def _relative(a: Tensor, b: Tensor) -> float:
    """Largest difference relative to the largest magnitude; NaN/Inf (a model with broken weights, named in a
    warning before) must stand in the same places with the same values, and only the finite rest is compared."""
    a, b = a.detach(), b.detach()
    finite = torch.isfinite(a)
    if not bool(finite.all()) or not bool(torch.isfinite(b).all()):
        if not same_nonfinite(a, b):
            return math.inf
        a, b = a[finite], b[finite]
        if a.numel() == 0:
            return 0.0
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-30)
    return float((a - b).abs().max()) / scale


def explain(exc: BaseException) -> str:
    """The cause of a torch.func failure and the way out, in a few words."""
    text = " ".join(str(exc).split())
    low = text.lower()
    if "setup_context" in text:
        return ("it runs a legacy torch.autograd.Function without setup_context, which torch.func cannot "
                "transform; give that Function a setup_context staticmethod or write it in plain torch ops")
    if "inplace" in low or "in-place" in low or "in place" in low:
        return ("it updates a tensor in place, which torch.func cannot batch; clone before writing "
                "(e.g. z = z.clone()) or build new tensors with torch.cat/torch.where")
    return f"{type(exc).__name__}: {text[:200]}"


def check_protocol(core: nn.Module, x: Tensor, *, seed: int = 0, rows: int = 4) -> None:
    """Run the checks of the module docstring on float inputs x (B, T, in) of ``core``'s dtype.

    The state is rolled from the core's initial state over x[:, :T−1]; the checks apply to the
    last step (time index T − 1). Raises GradscopeError naming the check that failed.
    """
    name = type(core).__name__
    B, T, _ = x.shape
    tol = tolerance(x.dtype)
    with torch.no_grad():
        try:
            z = initial_state(core, B, x)
            for t in range(T - 1):
                z = step_at(core, x[:, t], z, t)[1]
            t = T - 1
            xt = x[:, t]
            y, z_new = step_at(core, xt, z, t)
            singles = [step_at(core, xt[i:i + 1], z[i:i + 1], t) for i in range(B)]
        except GradscopeError:
            raise
        except Exception as exc:  # noqa: BLE001 - a user's step failed: one line, not a traceback
            raise GradscopeError(f"core: {name}.step failed on a batch of {B} ({explain(exc)})") from None
        for what, batched, single in (("output", y, torch.cat([s[0] for s in singles])),
                                      ("new state", z_new, torch.cat([s[1] for s in singles]))):
            err = _relative(batched, single)
            if not err <= tol:
                raise GradscopeError(f"core: check 'batched step = per-sample step' failed: {name}.step's {what} "
                                     f"for a batch of {B} differs from {B} one-sequence steps by {err:.2e} "
                                     f"(relative, > {tol:g}); the step mixes sequences, so its Jacobians "
                                     f"would be wrong")

    gen = torch.Generator().manual_seed(seed)
    cot_y = torch.randn(B, rows, y.shape[-1], generator=gen, dtype=torch.float64).to(y)
    cot_z = torch.randn(B, rows, z.shape[-1], generator=gen, dtype=torch.float64).to(z)

    def both(zz: Tensor, xx: Tensor) -> Tensor:  # (.., D) → (.., H + D): output and new state
        out, new = step_at(core, xx, zz, t)
        return torch.cat([out, new], dim=-1)

    cot = torch.cat([cot_y, cot_z], dim=-1)  # (B, k, H + D)
    try:
        _, pull = vjp(lambda zz: both(zz, xt), z)
        by_vjp = vmap(lambda c: pull(c)[0], in_dims=1, out_dims=1)(cot)  # (B, k, D)
    except Exception as exc:  # noqa: BLE001
        raise GradscopeError(f"core: torch.func.vjp cannot differentiate {name}.step (the 'vjp' engine): "
                             f"{explain(exc)}") from None
    try:
        def one(zi: Tensor, xi: Tensor, ci: Tensor) -> Tensor:  # one sequence: (D,), (in,), (k, H + D)
            _, pull_i = vjp(lambda zz: both(zz[None], xi[None])[0], zi)
            return vmap(lambda c: pull_i(c)[0])(ci)

        by_func = vmap(one)(z, xt, cot)  # (B, k, D)
    except Exception as exc:  # noqa: BLE001
        raise GradscopeError(f"core: torch.func cannot vmap {name}.step over sequences (the 'func' engine and "
                             f"the generic step Jacobians of the dynamics need it): {explain(exc)}; the 'vjp' "
                             f"engine alone would work: gradscope.wrap(..., checks=False), then method='vjp'") from None
    err = _relative(by_vjp, by_func)
    if not err <= tol:
        raise GradscopeError(f"core: check 'vjp engine = func engine' failed: the VJPs of {name}.step on a batch "
                             f"and per sequence differ by {err:.2e} (relative, > {tol:g}); the step mixes "
                             f"sequences or is not differentiable as written")
