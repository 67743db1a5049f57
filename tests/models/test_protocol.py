"""Issue #25, items 2 and 3: every user core is checked before its first Jacobian (batched step = per-sample
step; vjp engine = func engine; torch.func failures in one line), and the protocol's initial state and
time index are used by every scan, probe and trajectory."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import gradscope
from gradscope.analysis.dynamics import gradient_flow
from gradscope.analysis.lyapunov import lyapunov_spectrum
from gradscope.errors import GradscopeError

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class Tanh(nn.Module):
    """z' = tanh(W z + U x), y = z'; in_dim lets wrap check it at once."""

    in_dim = 3

    def __init__(self) -> None:
        super().__init__()
        self.W = nn.Parameter(1.2 * torch.randn(4, 4, generator=gen(1), dtype=F64))
        self.U = nn.Parameter(torch.randn(4, 3, generator=gen(2), dtype=F64))
        self.state_dim = self.out_dim = 4

    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        z = torch.tanh(z @ self.W.T + x @ self.U.T)
        return z, z


class MixesSequences(Tanh):
    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        y, z = super().step(x, z)
        return y, z + 0.1 * z.mean(0, keepdim=True)  # leaks across the batch


class InPlace(Tanh):
    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        buf = torch.zeros(z.shape[0], 4, dtype=z.dtype)
        buf[:, :2] = z[:, :2]  # writes a batched value into an unbatched tensor: vmap cannot
        z = torch.tanh((z + buf) @ self.W.T + x @ self.U.T)
        return z, z


class Legacy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        ctx.save_for_backward(x)
        return torch.tanh(x)

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        (x,) = ctx.saved_tensors
        return g * (1 - torch.tanh(x) ** 2)


class LegacyFunction(Tanh):
    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        z = Legacy.apply(z @ self.W.T + x @ self.U.T)
        return z, z


def test_a_sound_core_passes_and_is_checked_at_wrap_time() -> None:
    model = gradscope.wrap(Tanh())
    assert model.protocol_checked


@pytest.mark.parametrize("core, match", [
    (MixesSequences(), "check 'batched step = per-sample step' failed"),
    (InPlace(), "in place"),
    (LegacyFunction(), "setup_context"),
])
def test_bad_cores_are_refused_in_one_line_naming_the_check_or_cause(core: nn.Module, match: str) -> None:
    with pytest.raises(GradscopeError, match=match) as err:
        gradscope.wrap(core)
    assert "\n" not in str(err.value)


def test_the_in_place_error_names_the_way_out() -> None:
    with pytest.raises(GradscopeError, match="method='vjp'") as err:
        gradscope.wrap(InPlace())
    assert "clone" in str(err.value)
    model = gradscope.wrap(InPlace(), checks=False)  # the way out works: the vjp engine needs no vmap
    x = torch.randn(2, 5, 3, generator=gen(3), dtype=F64)
    assert gradscope.state_jacobian(model, x, 2, method="vjp").jac.abs().max() > 1e-3


def test_a_core_of_unknown_input_width_is_checked_on_its_first_batch() -> None:
    class NoWidth(MixesSequences):
        in_dim = None

    model = gradscope.wrap(NoWidth())
    assert not model.protocol_checked
    with pytest.raises(GradscopeError, match="batched step = per-sample step"):
        gradscope.state_jacobian(model, torch.randn(2, 5, 3, generator=gen(4), dtype=F64), 2)


class Offset(Tanh):
    """Starts from a non-zero state and reads its time index: z' = tanh(W z + U x + c·t)."""

    position_dependent = True

    def init_state(self, batch: int, like: Tensor) -> Tensor:
        return torch.full((batch, 4), 0.5, dtype=like.dtype)

    def step(self, x: Tensor, z: Tensor, t: int) -> tuple[Tensor, Tensor]:
        z = torch.tanh(z @ self.W.T + x @ self.U.T + 0.3 * t)
        return z, z


def rolled(core: Offset, x: Tensor) -> list[Tensor]:
    """The states by hand: from init_state, step t reading time index t."""
    z = core.init_state(x.shape[0], x)
    out = []
    for t in range(x.shape[1]):
        z = torch.tanh(z @ core.W.T + x[:, t] @ core.U.T + 0.3 * t)
        out.append(z)
    return out


def test_init_state_and_time_index_reach_every_engine() -> None:
    core = Offset()
    model = gradscope.wrap(core)
    x = torch.randn(2, 6, 3, generator=gen(5), dtype=F64)
    states = rolled(core, x)
    for method in ("vjp", "func"):
        res = gradscope.state_jacobian(model, x, 2, method=method)
        assert (res.state - states[1]).abs().max() < 1e-14  # scanned from init_state, with t
        assert (res.output - states[-1]).abs().max() < 1e-14
        # J by hand: product of the step Jacobians diag(1 − z_t²) W at the indexed steps
        J = torch.eye(4, dtype=F64).expand(2, 4, 4)
        for t in range(2, 6):
            J = (1 - states[t] ** 2)[:, :, None] * core.W @ J
        assert (res.jac - J).abs().max() < 1e-12
    fro, _ = gradient_flow(model, x)
    assert (fro[:, 1] - torch.linalg.matrix_norm(J)).abs().max() < 1e-12
    # Lyapunov: the log|det| sum check from the same indexed trajectory, started at init_state
    res = lyapunov_spectrum(core, x, warmup=1, sum_check=True)
    logdet = sum(torch.linalg.slogdet((1 - states[t] ** 2)[:, :, None] * core.W).logabsdet for t in range(1, 6)) / 5
    assert (res.log_det_mean - logdet).abs().max() < 1e-10
    assert (res.exponents.sum(-1) - logdet).abs().max() < 1e-10
