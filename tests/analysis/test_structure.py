"""Structure-aware and partial Lyapunov spectra, float64 QR, −∞ and below resolution (issue #23),
against independent references: closed forms, a known triangular system, the dense float64 engine."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import gradscope.analysis.dynamics as dyn
from gradscope.analysis.lyapunov import lyapunov_spectrum
from gradscope.config import ModelConfig
from gradscope.errors import GradscopeError
from gradscope.models import SeqModel
from gradscope.models.core import Core, generic_diagonal_blocks
from gradscope.models.structure import JacobianStructure, StateBlock
from gradscope.models.wrap import wrap
from gradscope.workflows.dynamics import DynamicsOptions, plan_dynamics, run_model_dynamics

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def s4d(layers: int, H: int = 3, N: int = 8, dtype: torch.dtype = F64) -> SeqModel:
    torch.manual_seed(layers)
    cfg = ModelConfig(core="s4d", vocab_size=16, embed_size=6, hidden_size=H, num_layers=layers, pe="none", max_len=8,
                      core_config={"state_size": N, "dt_min": 0.05, "dt_max": 0.5})
    model = SeqModel(cfg)
    with torch.no_grad():  # distinct decay rates per mode: S4D's init repeats them across channels
        for block in model.core.ssm:
            block.kernel.log_A_real.copy_(torch.rand(block.kernel.log_A_real.shape, generator=_gen(layers)) * 3 - 2)
    return model.to(dtype).eval()


def rnn(core: str, H: int, scale: float = 2.5, dtype: torch.dtype = F64) -> SeqModel:
    torch.manual_seed(0)
    model = SeqModel(ModelConfig(core=core, vocab_size=16, embed_size=8, hidden_size=H, pe="none", max_len=8))
    with torch.no_grad():  # default init contracts everything to ~0: scale up so the spectrum is spread
        for p in model.core.parameters():
            p.mul_(scale)
    return model.to(dtype).eval()


def closed_form_s4d(model: SeqModel) -> torch.Tensor:
    """log|dA| of every mode, twice (real view), sorted descending: the exponents of any S4D stack."""
    with torch.no_grad():
        dA = torch.cat([b.kernel.discrete()[0].reshape(-1) for b in model.core.ssm])
    return dA.abs().log().double().repeat_interleave(2).sort(descending=True).values


@pytest.mark.parametrize("layers", [1, 3])
def test_s4d_structured_exponents_equal_the_closed_form(layers: int) -> None:
    model = s4d(layers)
    x = model.core_inputs(torch.randint(0, 16, (2, 60), generator=_gen(1)))
    res = lyapunov_spectrum(model.core, x, warmup=10)
    assert res.engine == "structured" and "complex_diagonal" in res.structure
    assert res.exponents.shape == (2, model.core.state_dim)
    torch.testing.assert_close(res.exponents, closed_form_s4d(model).expand(2, -1), rtol=0, atol=1e-6)
    assert not res.below_resolution.any()


def test_structured_equals_dense_float64_qr() -> None:
    one = s4d(1)  # one diagonal block: the dense QR of a 2 × 2 rotation-scaling per mode is exact too
    x = one.core_inputs(torch.randint(0, 16, (2, 80), generator=_gen(2)))
    a = lyapunov_spectrum(one.core, x, warmup=10)
    b = lyapunov_spectrum(one.core, x, warmup=10, engine="dense")
    torch.testing.assert_close(a.exponents, b.exponents, rtol=0, atol=1e-10)
    two = s4d(2)  # block lower-triangular: the dense estimate converges to the union at O(1/T)
    errors = []
    for T in (1500, 6000):
        x = two.core_inputs(torch.randint(0, 16, (1, T), generator=_gen(3)))
        a = lyapunov_spectrum(two.core, x, warmup=100)
        b = lyapunov_spectrum(two.core, x, warmup=100, engine="dense")
        errors.append(float((a.exponents - b.exponents).abs().max()))
    assert errors[1] < 1e-2 and errors[1] < errors[0] / 2.5, errors  # measured 0.023 → 0.0054 (4× the steps)


class TriangularLinear(Core):
    """z' = A z + W x with A block lower-triangular: a diagonal block, then a per-head (2 × 2) block,
    then a dense block, each reading the blocks above it; the declared structure says exactly that."""

    name = "triangular-test"
    gate_names = ("step",)

    def __init__(self, diag: torch.Tensor, heads: torch.Tensor, dense: torch.Tensor) -> None:
        super().__init__()
        n1, n2, n3 = len(diag), 2 * len(heads), len(dense)
        D = n1 + n2 + n3
        g = _gen(7)
        A = torch.randn(D, D, generator=g, dtype=F64).tril() * 0.5  # below-diagonal coupling, any values
        A[:n1, :n1] = torch.diag(diag)
        A[n1:n1 + n2, n1:n1 + n2] = torch.block_diag(*heads)
        A[n1 + n2:, n1 + n2:] = dense
        A[:n1, n1:] = 0
        A[n1:n1 + n2, n1 + n2:] = 0
        self.register_buffer("A", A)
        self.W = nn.Parameter(torch.randn(D, 2, generator=g, dtype=F64))
        self.state_dim, self.out_dim, self.sizes = D, D, (n1, n2, n3)

    def step(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        new = z @ self.A.T + x @ self.W.T
        return new, new

    def jacobian_structure(self) -> JacobianStructure:
        n1, n2, n3 = self.sizes
        return JacobianStructure((StateBlock("a", 0, n1, "diagonal"), StateBlock("b", n1, n1 + n2, "block_diagonal", 2),
                                  StateBlock("c", n1 + n2, n1 + n2 + n3, "dense")))


def test_block_lower_triangular_system_with_known_diagonals() -> None:
    diag = torch.tensor([0.9, -0.5, 0.2], dtype=F64)
    rot = lambda r, th: r * torch.tensor([[math.cos(th), -math.sin(th)], [math.sin(th), math.cos(th)]], dtype=F64)  # noqa: E731
    heads = torch.stack([rot(0.7, 0.3), rot(1.1, 1.0)])
    dense = torch.tensor([[0.8, 0.3], [0.0, 0.4]], dtype=F64)  # eigenvalues 0.8, 0.4
    core = TriangularLinear(diag, heads, dense)
    x = torch.randn(2, 400, 2, generator=_gen(4), dtype=F64)
    res = lyapunov_spectrum(core, x, warmup=50)
    expected = torch.tensor([0.9, 0.5, 0.2, 0.7, 0.7, 1.1, 1.1, 0.8, 0.4], dtype=F64).log().sort(descending=True).values
    assert res.engine == "structured"
    torch.testing.assert_close(res.exponents, expected.expand(2, -1), rtol=0, atol=2e-3)  # the dense block's transient
    dense_run = lyapunov_spectrum(core, x, warmup=50, engine="dense")
    assert (dense_run.exponents - expected).abs().max() < 5e-3
    # the generic compact blocks (torch.func, restricted to a block) read the same numbers
    blocks = generic_diagonal_blocks(core, x[:, 0], torch.zeros(2, core.state_dim, dtype=F64))
    torch.testing.assert_close(blocks[0][0], diag)
    torch.testing.assert_close(blocks[1][0], heads)
    torch.testing.assert_close(blocks[2][0], dense)


@pytest.mark.parametrize("core,H", [("gru", 24), ("lstm", 12)])
def test_partial_spectrum_is_the_top_k_of_the_full_one(core: str, H: int) -> None:
    model = rnn(core, H)
    x = model.core_inputs(torch.randint(0, 16, (3, 300), generator=_gen(5)))
    full = lyapunov_spectrum(model.core, x, warmup=50)
    for apply in ("jvp", "jacobian"):
        part = lyapunov_spectrum(model.core, x, warmup=50, exponents=5, apply=apply)
        assert part.engine == "partial" and part.exponents.shape == (3, 5)
        torch.testing.assert_close(part.exponents, full.exponents[:, :5], rtol=0, atol=1e-8)
        # running estimates are sorted at each checkpoint: early on, columns past k may still lead
        torch.testing.assert_close(part.running[:, -1], full.running[:, -1, :5], rtol=0, atol=1e-8)


class ShiftRegister(Core):
    """A tanh cell that reads a two-entry shift register of its inputs: c1' = x, c2' = c1,
    h' = tanh(W h + u·c2). The register's own block is nilpotent: two exponents are exactly −∞."""

    name = "shift-test"

    def __init__(self, H: int = 3) -> None:
        super().__init__()
        g = _gen(8)
        self.Wh = nn.Parameter(torch.randn(H, H, generator=g, dtype=F64))
        self.u = nn.Parameter(torch.randn(H, generator=g, dtype=F64))
        self.state_dim, self.out_dim, self.H = H + 2, H, H

    def step(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c, h = z[:, :2], z[:, 2:]
        c_new = torch.stack([x[:, 0], c[:, 0]], dim=-1)
        h_new = torch.tanh(h @ self.Wh.T + c[:, 1:2] * self.u)
        return h_new, torch.cat([c_new, h_new], dim=-1)


class DeclaredShiftRegister(ShiftRegister):
    def jacobian_structure(self) -> JacobianStructure:
        return JacobianStructure((StateBlock("conv", 0, 2, "dense"), StateBlock("h", 2, 2 + self.H, "dense")))


def test_a_planted_shift_register_gives_exactly_minus_infinity() -> None:
    x = torch.randn(2, 200, 1, generator=_gen(9), dtype=F64)
    structured = lyapunov_spectrum(DeclaredShiftRegister(), x, warmup=20)
    assert structured.engine == "structured"
    assert torch.isneginf(structured.exponents[:, -2:]).all() and torch.isfinite(structured.exponents[:, :-2]).all()
    assert torch.isneginf(structured.sum()).all()
    dense = lyapunov_spectrum(ShiftRegister(), x, warmup=20)  # no declared structure: dense Benettin
    tail = dense.exponents[:, -2:]
    # the two register exponents are −inf or flagged below resolution, never reported as measured values
    assert (torch.isneginf(tail) | dense.below_resolution[:, -2:]).all()
    assert not dense.resolved[:, -2:].any() and dense.resolved[:, :-2].all()
    torch.testing.assert_close(dense.exponents[:, :-2], structured.exponents[:, :-2], rtol=0, atol=2e-2)


def test_float32_jacobians_with_a_float64_qr_stay_close_to_float64() -> None:
    model = rnn("gru", 32, dtype=torch.float32)
    x = model.core_inputs(torch.randint(0, 16, (2, 400), generator=_gen(10))).detach()
    ref_model = SeqModel(model.config).double()
    ref_model.load_state_dict(model.state_dict())
    ref = lyapunov_spectrum(ref_model.core, x.double(), warmup=50).exponents
    mixed = lyapunov_spectrum(model.core, x, warmup=50)  # float32 J, float64 J·Q, QR and log-sums
    low = lyapunov_spectrum(model.core, x, warmup=50, qr_dtype=torch.float32)
    assert mixed.exponents.dtype == F64
    err_mixed, err_low = (mixed.exponents - ref).abs().max(), (low.exponents - ref).abs().max()
    assert err_mixed < 1e-4  # measured 7.5e-6 here; float32 QR: 4.5e-5
    assert err_mixed < err_low


def test_sum_check_is_finite_for_a_float32_lstm_with_a_wide_spectrum() -> None:
    model = rnn("lstm", 16, scale=4.0, dtype=torch.float32)
    x = model.core_inputs(torch.randint(0, 16, (2, 300), generator=_gen(11))).detach()
    res = lyapunov_spectrum(model.core, x, warmup=30, sum_check=True)
    assert torch.isfinite(res.log_det_mean).all()
    if res.resolved.all():
        torch.testing.assert_close(res.log_det_mean, res.sum(), rtol=0, atol=1e-3)


@pytest.mark.parametrize("layers", [1, 2])
def test_structured_flow_grid_spectra_and_gates_equal_the_dense_forms(layers: int, monkeypatch) -> None:
    model = s4d(layers, N=10)
    toks = torch.randint(0, 16, (3, 9), generator=_gen(12))
    got = (dyn.gradient_flow(model, toks), dyn.tT_grid(model, toks), dyn.step_spectra(model, toks),
           dyn.gate_norms(model.core, model.core_inputs(toks))[1])
    monkeypatch.setattr(type(model.core), "jacobian_structure", lambda self: None)  # the dense engines
    want = (dyn.gradient_flow(model, toks, method="jacobian"), dyn.tT_grid(model, toks), dyn.step_spectra(model, toks),
            dyn.gate_norms(model.core, model.core_inputs(toks))[1])
    for a, b in zip(got[0], want[0]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-12, equal_nan=True)
    for key in ("radius", "singular_values"):
        torch.testing.assert_close(got[2][key], want[2][key], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got[3], want[3], rtol=1e-10, atol=1e-12)


def test_the_budget_picks_what_fits_and_names_the_option() -> None:
    from gradscope.models.structure import dense_structure
    opts = DynamicsOptions(parts=("lyapunov",))
    small = plan_dynamics(opts, 32, 32, 128, 128, dense_structure(128), 3)
    assert small.exponents == 128 and small.engine == "dense"
    big = plan_dynamics(opts, 32, 32, 1024, 512, dense_structure(1024), 5)
    assert big.engine == "partial" and 1 <= big.exponents < 1024 and "top" in big.note
    with pytest.raises(GradscopeError, match="--exponents"):
        plan_dynamics(DynamicsOptions(parts=("lyapunov",), exponents=1024), 32, 32, 1024, 512, dense_structure(1024), 5)
    with pytest.raises(GradscopeError, match="--parts"):
        plan_dynamics(DynamicsOptions(parts=("spectra",)), 32, 64, 8192, 128, dense_structure(8192), 1)
    structured = s4d(1, H=128, N=64, dtype=torch.float32)  # the shipped sample's size: D = 8192
    from gradscope.models.structure import structure_of
    from gradscope.workflows.dynamics import core_shape
    width = structured.core_inputs(torch.zeros(1, 1, dtype=torch.long)).shape[-1]
    plan = plan_dynamics(DynamicsOptions(), 32, 32, 8192, 128, structure_of(structured.core), 1,
                         shape=core_shape(structured.core, width))  # its own step cost, not a dense guess
    assert plan.exponents == 8192 and plan.engine == "structured"


def test_options_papercuts() -> None:
    assert DynamicsOptions(steps=50).lyap_warmup == 5 and DynamicsOptions().filled().lyap_warmup == 100  # a tenth, at most 100
    with pytest.raises(GradscopeError, match="below steps = 50"):
        DynamicsOptions(steps=50, lyap_warmup=60)
    assert DynamicsOptions(parts="lyapunov").parts == ("lyapunov",)
    assert DynamicsOptions(parts="flow, grid").parts == ("flow", "grid")


def test_wrapped_model_accepts_parts_as_a_string_and_minus_infinity_is_not_divergence(recwarn) -> None:
    torch.manual_seed(0)
    model = wrap(nn.LSTM(4, 6, batch_first=True), nn.Embedding(10, 4))
    tokens = torch.randint(0, 10, (2, 6), generator=_gen(13))
    run = run_model_dynamics(model, tokens, DynamicsOptions(parts="lyapunov", trajectories=2, steps=40))
    assert "lyapunov" in run.results[0].parts
    assert not [w for w in recwarn if "diverged" in str(w.message)]
    assert np.isfinite(run.results[0].parts["lyapunov"]).any()


def test_the_docs_example_core_declares_its_structure() -> None:
    """The user core in docs/dynamics.md runs as printed: exact exponents log|a_i| from its declared
    diagonal, equal to the generic torch.func blocks and to the dense engine."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "dynamics.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(block, "docs/dynamics.md", "exec"), scope)  # noqa: S102 - the project's own docs
    torch.manual_seed(0)
    core = scope["DiagonalRNN"](6, 3).double()
    x = torch.randn(2, 50, 3, generator=_gen(14), dtype=F64)
    res = lyapunov_spectrum(core, x, warmup=5)
    assert res.engine == "structured"
    torch.testing.assert_close(res.exponents[0], core.a.detach().abs().log().sort(descending=True).values)
    torch.testing.assert_close(generic_diagonal_blocks(core, x[:, 0], torch.zeros(2, 6, dtype=F64))[0],
                               core.diagonal_blocks(x[:, 0], torch.zeros(2, 6, dtype=F64))[0])
    torch.testing.assert_close(lyapunov_spectrum(core, x, warmup=5, engine="dense").exponents, res.exponents)


def test_a_saturated_forget_gate_gives_minus_infinity_said_and_flagged() -> None:
    """A forget gate saturated to exactly 0 in float32 makes J_t singular: mean log|det J_t| is −inf
    (exact, not an accumulation failure), and the c exponents are flagged below resolution instead of
    being reported as the −37 that rounding leaves in a dense QR."""
    model = rnn("lstm", 8, scale=1.0, dtype=torch.float32)
    with torch.no_grad():
        model.core.rnn.bias_ih_l0[8:16] = -200.0  # sigmoid(−200) = 0 exactly in float32
    x = model.core_inputs(torch.randint(0, 16, (2, 100), generator=_gen(15))).detach()
    res = lyapunov_spectrum(model.core, x, warmup=10, sum_check=True)
    assert torch.isneginf(res.log_det_mean).all()
    assert (res.below_resolution[:, -8:] | torch.isneginf(res.exponents[:, -8:])).all()
    assert res.resolved[:, :8].all()


class GatedDelta(Core):
    """The gated delta rule, one layer: per head S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ
    (k_t unit-norm; α, β ∈ (0, 1) read from the input), output S_tᵀ q_t. The state is laid out (heads,
    d_v, d_k): row j of Sᵀ evolves by M_t = α_t (I − β_t k_t k_tᵀ), so J_t's own block is M_t ⊗ I_{d_v}:
    block_diagonal of size d_k, each head's d_v copies one block (``repeat``). The blocks come from the
    generic dense J (every copy), so the engine's reading of one copy a head is what is tested."""

    name = "gated-delta-test"
    gate_names = ("step",)

    def __init__(self, heads: int, dk: int, dv: int, inputs: int, repeat: int | None = None) -> None:
        super().__init__()
        g = _gen(11)
        self.h, self.dk, self.dv = heads, dk, dv
        self.Wk = nn.Parameter(torch.randn(heads * dk, inputs, generator=g, dtype=F64))
        self.Wq = nn.Parameter(torch.randn(heads * dk, inputs, generator=g, dtype=F64))
        self.Wv = nn.Parameter(torch.randn(heads * dv, inputs, generator=g, dtype=F64))
        self.Wab = nn.Parameter(torch.randn(2 * heads, inputs, generator=g, dtype=F64))
        self.state_dim, self.out_dim = heads * dv * dk, heads * dv
        self.repeat = dv if repeat is None else repeat

    def step(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B = x.shape[0]
        k = torch.nn.functional.normalize((x @ self.Wk.T).view(B, self.h, self.dk), dim=-1)
        q = (x @ self.Wq.T).view(B, self.h, self.dk)
        v = (x @ self.Wv.T).view(B, self.h, self.dv)
        alpha, beta = torch.sigmoid(x @ self.Wab.T).view(B, 2, self.h).unbind(1)
        X = z.view(B, self.h, self.dv, self.dk)  # Sᵀ per head
        Xk = X @ k[..., None]  # (B, h, d_v, 1)
        new = alpha[..., None, None] * (X - beta[..., None, None] * Xk * k[:, :, None, :]) \
            + (beta[..., None] * v)[..., None] * k[:, :, None, :]
        return (new @ q[..., None])[..., 0].reshape(B, -1), new.reshape(B, -1)

    def jacobian_structure(self) -> JacobianStructure:
        return JacobianStructure((StateBlock("s", 0, self.state_dim, "block_diagonal", self.dk, self.repeat),))


def test_the_gated_delta_rule_as_a_repeated_block_equals_a_dense_qr_of_its_full_step_jacobian() -> None:
    """Issue #49 part 1: M_t ⊗ I declared as a repeated block: the structured engine QRs one d_k × d_k
    cocycle a head and counts each exponent d_v times; equal to Benettin/QR on the full D × D step
    Jacobian (float64), and to the same structure declared without the repeat (every copy its own QR)."""
    core = GatedDelta(heads=2, dk=3, dv=4, inputs=5)
    x = torch.randn(2, 300, 5, generator=_gen(12), dtype=F64)
    res = lyapunov_spectrum(core, x, warmup=20, sum_check=True)
    assert res.engine == "structured" and "block_diagonal(3, ×4)" in res.structure
    dense = lyapunov_spectrum(core, x, warmup=20, engine="dense", sum_check=True)
    torch.testing.assert_close(res.exponents, dense.exponents, rtol=0, atol=1e-10)
    torch.testing.assert_close(res.log_det_mean, dense.log_det_mean, rtol=1e-12, atol=1e-12)
    unrepeated = lyapunov_spectrum(GatedDelta(heads=2, dk=3, dv=4, inputs=5, repeat=1), x, warmup=20)
    torch.testing.assert_close(res.exponents, unrepeated.exponents, rtol=0, atol=1e-12)
    for b in range(2):  # every value d_v times: 2 heads × 3 distinct exponents, each 4 times
        values, counts = res.exponents[b].unique_consecutive(return_counts=True)
        assert len(values) == 6 and (counts == 4).all()
    part = lyapunov_spectrum(core, x, warmup=20, exponents=10)  # the top k of a repeated spectrum
    torch.testing.assert_close(part.exponents, res.exponents[:, :10], rtol=0, atol=0)
    assert part.running.shape[-1] == 10
