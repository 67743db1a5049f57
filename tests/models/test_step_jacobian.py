"""Step Jacobians J_t = ∂z_t/∂z_{t−1}, their gate decomposition and the static W_hh blocks (SPEC §7),
for every registered core, against float64 autograd and closed forms written here from the weights."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from gradscope.models import CORES

from tests.helpers.cores import tiny_core
from gradscope.models.core import Core, gate_terms, generic_step_jacobian, step_jacobian
from gradscope.models.rnn import RNNCore

IN, H, B = 4, 5, 3
TOL = 1e-12


def _core(name: str, layers: int, seed: int = 0) -> Core:
    """A float64 core with Jacobians far from tiny (tests/helpers/cores.py: W_hh scaled by 3; S4D's large dt)."""
    return tiny_core(name, IN, H, layers, seed=seed)


def _point(core: Core, seed: int = 1) -> tuple[Tensor, Tensor]:
    """x (B, in) and a random state z (B, D): every part nonzero, the LSTM's c included."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, IN, generator=gen, dtype=torch.float64)
    z = torch.randn(B, core.state_dim, generator=gen, dtype=torch.float64)
    return x, z


def _autograd(core: nn.Module, x: Tensor, z: Tensor) -> Tensor:
    """The oracle: torch.autograd.functional.jacobian of the step, batch diagonal kept → (B, D, D)."""
    full = torch.autograd.functional.jacobian(lambda z_: core.step(x, z_)[1], z)  # (B, D, B, D)
    return torch.stack([full[b, :, b] for b in range(z.shape[0])])


def _err(t: Tensor) -> float:
    """max |t| as a float (detached: the Jacobians carry the weights' graph)."""
    return float(t.detach().abs().max())


CASES = [(name, layers) for name in CORES for layers in (1, 2, 3)]  # 3: chains through two lower layers


@pytest.mark.parametrize("name,layers", CASES)
def test_step_jacobian_matches_autograd(name: str, layers: int) -> None:
    core = _core(name, layers)
    x, z = _point(core)
    J = core.step_jacobian(x, z)
    assert J.shape == (B, core.state_dim, core.state_dim) and J.dtype == torch.float64
    expected = _autograd(core, x, z)
    assert _err(J - expected) <= TOL
    assert _err(expected) > 0.1  # not a vacuous comparison
    if layers == 2:  # the upper layer reads the lower one's new state: a nonzero block below the diagonal
        half = core.state_dim // 2
        assert _err(J[:, half:, :half]) > 1e-3
    # the generic torch.func fallback (Core's default) agrees too
    assert _err(generic_step_jacobian(core, x, z) - expected) <= TOL
    assert _err(step_jacobian(core, x, z) - J) == 0.0


@pytest.mark.parametrize("name,layers", CASES)
def test_gate_terms_sum_to_step_jacobian(name: str, layers: int) -> None:
    core = _core(name, layers)
    x, z = _point(core)
    terms = core.gate_terms(x, z)
    assert tuple(terms) == type(core).gate_names
    for key, term in terms.items():
        assert term.shape == (B, core.state_dim, core.state_dim), key
        assert _err(term) > 1e-3, f"term {key!r} is zero"
    assert _err(sum(terms.values()) - core.step_jacobian(x, z)) <= TOL
    assert tuple(gate_terms(core, x, z)) == tuple(terms)


@pytest.mark.parametrize("layers", [1, 2])
def test_gru_carry_term_is_diag_u(layers: int) -> None:
    """carry = diag(u) per layer with u = σ(W_iu x + b_iu + W_hu h + b_hu), the upper layer reading
    the lower layer's new h; no cross-layer part (u ⊙ h has no input path)."""
    core = _core("gru", layers)
    x, z = _point(core)
    carry = core.gate_terms(x, z)["carry"]
    expected = torch.zeros_like(carry)
    inp = x
    for layer, h in enumerate(z.split(H, dim=-1)):
        w_ih, w_hh, b_ih, b_hh = (getattr(core.rnn, f"{n}_l{layer}")
                                  for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
        gi, gh = inp @ w_ih.T + b_ih, h @ w_hh.T + b_hh
        r = torch.sigmoid(gi[:, :H] + gh[:, :H])
        u = torch.sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
        n = torch.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
        expected[:, layer * H:(layer + 1) * H, layer * H:(layer + 1) * H] = torch.diag_embed(u)
        inp = (1 - u) * n + u * h
    assert _err(carry - expected) <= TOL


def test_lstm_forget_term_is_the_c_carry() -> None:
    """forget = [[0, diag(o(1 − tanh²c')·f)], [0, diag(f)]] on [h, c]: the c columns, nothing else."""
    core = _core("lstm", 1)
    x, z = _point(core)
    h, c = z.chunk(2, dim=-1)
    pre = x @ core.rnn.weight_ih_l0.T + core.rnn.bias_ih_l0 + h @ core.rnn.weight_hh_l0.T + core.rnn.bias_hh_l0
    i, f, g, o = torch.sigmoid(pre[:, :H]), torch.sigmoid(pre[:, H:2 * H]), torch.tanh(pre[:, 2 * H:3 * H]), \
        torch.sigmoid(pre[:, 3 * H:])
    c_new = f * c + i * g
    expected = torch.zeros(B, 2 * H, 2 * H, dtype=torch.float64)
    expected[:, :H, H:] = torch.diag_embed(o * (1 - torch.tanh(c_new) ** 2) * f)
    expected[:, H:, H:] = torch.diag_embed(f)
    assert _err(core.gate_terms(x, z)["forget"] - expected) <= TOL


def _path_jacobians(fn, x: Tensor, inputs: tuple[Tensor, ...]) -> list[Tensor]:  # type: ignore[no-untyped-def]
    """∂fn/∂input_k for each of fn's state inputs (batch diagonal kept) → [(B, out, in_k)]."""
    full = torch.autograd.functional.jacobian(lambda *a: fn(x, *a), inputs)
    return [torch.stack([j[b, :, b] for b in range(x.shape[0])]) for j in full]


def test_each_gru_term_is_its_own_path() -> None:
    """Feed h to each path of the cell as a separate argument (carry, r, u, n); the derivative with
    respect to that argument alone, at all arguments equal to h, is that path's term."""
    core = _core("gru", 1)
    x, h = _point(core)
    w_ih, w_hh, b_ih, b_hh = core.layer_weights(0)

    def paths(x_: Tensor, h_carry: Tensor, h_r: Tensor, h_u: Tensor, h_n: Tensor) -> Tensor:
        gi = (x_ @ w_ih.T + b_ih).chunk(3, dim=-1)
        r = torch.sigmoid(gi[0] + h_r @ w_hh[:H].T + b_hh[:H])
        u = torch.sigmoid(gi[1] + h_u @ w_hh[H:2 * H].T + b_hh[H:2 * H])
        n = torch.tanh(gi[2] + r * (h_n @ w_hh[2 * H:].T + b_hh[2 * H:]))
        return (1 - u) * n + u * h_carry

    expected = _path_jacobians(paths, x, (h,) * 4)
    terms = core.gate_terms(x, h)
    for name, jac in zip(("carry", "r", "u", "n"), expected):
        assert _err(terms[name] - jac) <= TOL, name


def test_each_lstm_term_is_its_own_path() -> None:
    """The same for the LSTM on [h, c]: h fed separately to the i, f, g, o pre-activations, and c
    (the carry f ⊙ c) to the ``forget`` term, which owns the c columns."""
    core = _core("lstm", 1)
    x, z = _point(core)
    h, c = z.chunk(2, dim=-1)
    w_ih, w_hh, b_ih, b_hh = core.layer_weights(0)

    def paths(x_: Tensor, c_: Tensor, h_i: Tensor, h_f: Tensor, h_g: Tensor, h_o: Tensor) -> Tensor:
        pre = (x_ @ w_ih.T + b_ih + b_hh).chunk(4, dim=-1)
        i, f, g, o = (act(p + h_k @ w_k.T) for act, p, h_k, w_k in
                      zip((torch.sigmoid, torch.sigmoid, torch.tanh, torch.sigmoid), pre, (h_i, h_f, h_g, h_o),
                          w_hh.chunk(4)))
        c_new = f * c_ + i * g
        return torch.cat([o * torch.tanh(c_new), c_new], dim=-1)

    d_c, *d_h = _path_jacobians(paths, x, (c, h, h, h, h))
    terms = core.gate_terms(x, z)
    zeros = torch.zeros(B, 2 * H, H, dtype=torch.float64)
    assert _err(terms["forget"] - torch.cat([zeros, d_c], dim=-1)) <= TOL
    for name, jac in zip(("i", "f", "g", "o"), d_h):
        assert _err(terms[name] - torch.cat([jac, zeros], dim=-1)) <= TOL, name


def test_elman_term_is_tanh_derivative_times_w_hh() -> None:
    core = _core("elman", 1)
    x, z = _point(core)
    w_hh = core.rnn.weight_hh_l0
    h_new = torch.tanh(x @ core.rnn.weight_ih_l0.T + core.rnn.bias_ih_l0 + z @ w_hh.T + core.rnn.bias_hh_l0)
    expected = (1 - h_new ** 2)[:, :, None] * w_hh
    assert _err(core.gate_terms(x, z)["h"] - expected) <= TOL


def test_s4d_single_block_is_rotation_scaling_per_mode() -> None:
    """One block: J = ⊕ |dA|·[[cos θ, −sin θ], [sin θ, cos θ]] with |dA| = exp(−exp(log_dt + log_A_real))
    and θ = exp(log_dt)·A_imag (SPEC §7), whatever the input or state."""
    core = _core("s4d", 1)
    x, z = _point(core)
    kern = core.ssm[0].kernel
    dt = torch.exp(kern.log_dt)[:, None]
    mag, theta = torch.exp(-dt * torch.exp(kern.log_A_real)), dt * kern.A_imag  # (H, N/2)
    blocks = [torch.tensor([[m * math.cos(t), -m * math.sin(t)], [m * math.sin(t), m * math.cos(t)]],
                           dtype=torch.float64) for m, t in zip(mag.flatten().tolist(), theta.flatten().tolist())]
    expected = torch.block_diag(*blocks).expand(B, -1, -1)
    assert _err(core.gate_terms(x, z)["transition"] - expected) <= TOL
    assert _err(core.step_jacobian(x * 7, z * -3) - expected) <= TOL


class _UserCell(nn.Module):
    """A protocol core that is not a gradscope Core: z' = tanh(W z + V x), no step_jacobian method."""

    state_dim, out_dim = 4, 4

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.W = nn.Parameter(2 * torch.randn(4, 4, generator=gen, dtype=torch.float64))
        self.V = nn.Parameter(torch.randn(4, IN, generator=gen, dtype=torch.float64))

    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        h = torch.tanh(z @ self.W.T + x @ self.V.T)
        return h, h


def test_protocol_core_without_the_methods_gets_the_generic_jacobian() -> None:
    core = _UserCell()
    x, z = _point(core)  # type: ignore[arg-type]
    h_new = core.step(x, z)[1]
    expected = (1 - h_new ** 2)[:, :, None] * core.W
    assert _err(step_jacobian(core, x, z) - expected) <= TOL
    terms = gate_terms(core, x, z)
    assert list(terms) == ["step"] and _err(terms["step"] - expected) <= TOL


def test_replaced_cell_falls_back_to_the_generic_jacobian() -> None:
    """A core whose cell function was replaced must not use the analytic form of the old cell."""
    core = _core("elman", 2)
    core.cell = lambda x, s, w_ih, w_hh, b_ih, b_hh: (torch.sin(x @ w_ih.T + s @ w_hh.T),) * 2
    x, z = _point(core)
    expected = _autograd(core, x, z)
    assert _err(core.step_jacobian(x, z) - expected) <= TOL
    terms = core.gate_terms(x, z)
    assert list(terms) == ["step"] and _err(terms["step"] - expected) <= TOL


@pytest.mark.parametrize("name", list(CORES))
def test_recurrent_blocks_are_the_gate_blocks_of_w_hh(name: str) -> None:
    core = _core(name, 2)
    blocks = core.recurrent_blocks()
    if not isinstance(core, RNNCore):
        assert blocks == {}
        return
    gates = type(core).gates
    assert list(blocks) == [f"l{layer}/{g}" for layer in (1, 2) for g in gates]
    for layer in (1, 2):
        w_hh = getattr(core.rnn, f"weight_hh_l{layer - 1}")
        for k, g in enumerate(gates):
            assert torch.equal(blocks[f"l{layer}/{g}"], w_hh[k * H:(k + 1) * H])
