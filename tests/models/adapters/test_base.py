"""What every library adapter shares (gradscope/models/adapters/base.py), on its own: the named flat state of a
LibraryCore (pack/unpack, layout, declared structure), the norm, linear and conv pieces with their forward- and
reverse-mode products against torch.func and torch.nn.functional in float64, the token map, and the wrap-time
agreement check. No library is imported; the adapters themselves are tests/models/adapters/test_hf_*.py's."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import GradscopeError
from gradscope.models.adapters.base import (ERROR_COEF, HALF_CAP, MARGIN, Entry, LibraryCore, TokenMap, adapt_backbone,
                                            agreement_tolerance, check_against_library, conv_pre, conv_silu_jvp,
                                            conv_silu_vjp, hf_forward, linear_jvp, norm_linear_jvp, rms, rms_jvp,
                                            rms_norm, rms_vjp, shift_blocks, shift_window_jvp, silu_grad)
from gradscope.models.structure import StateBlock

F64 = torch.float64
B, C, K, M, N = 2, 3, 4, 3, 5  # batch, conv channels, conv width, tangents or cotangent rows, feature width
TOL = 1e-12
EPS = 1e-5


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=gen(seed), dtype=F64)


def jvp(f, primals: tuple[Tensor, ...], tangents: tuple[Tensor, ...]):  # type: ignore[no-untyped-def]
    """The reference forward-mode product (f(primals), J·tangents), by reverse mode twice: torch.func's forward
    mode warns (a torch.jit deprecation inside torch) on this torch version."""
    return torch.autograd.functional.jvp(f, primals, tangents)


# --- the named state ---------------------------------------------------------------------------------------------

HEADS, DK, DV = 2, 2, 3
ENTRIES = [Entry("l0/conv", (C, K - 1), "block_diagonal", size=K - 1), Entry("l0/ssm", (C, 2), "diagonal"),
           Entry("l1/delta", (HEADS, DV, DK)), Entry("l1/keys", (4, 1, 2), "diagonal", held=True)]


class Toy(LibraryCore):
    """A LibraryCore whose step doubles the state and records what it was asked."""

    def __init__(self) -> None:
        super().__init__(nn.Linear(2, 2), ENTRIES, out_dim=7)
        self.calls: list[tuple[int | None, bool]] = []

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        self.calls.append((t, diagonal))
        return x + 1, 2 * z, [z[:, :1]] if diagonal else []


def test_an_entrys_width_is_its_shapes_product() -> None:
    assert Entry("a", (3, 4, 5)).width == 60 and Entry("s", ()).width == 1
    e = Entry("a", (2,))
    assert (e.form, e.size, e.repeat, e.held) == ("dense", 1, 1, False)


def test_the_layout_tiles_the_state_in_the_entries_order() -> None:
    core = Toy()
    widths = [C * (K - 1), C * 2, HEADS * DV * DK, 8]
    assert core.state_dim == sum(widths) and core.out_dim == 7
    starts = [0, widths[0], widths[0] + widths[1], sum(widths[:3])]
    assert core.state_layout() == {e.name: slice(s, s + w) for e, s, w in zip(ENTRIES, starts, widths)}
    assert isinstance(core.model, nn.Linear) and "model" in dict(core.named_children())  # by reference, registered


def test_unpack_is_row_major_and_pack_inverts_it() -> None:
    core = Toy()
    z = torch.arange(2 * core.state_dim, dtype=F64).reshape(2, -1)
    parts = core.unpack(z)
    assert list(parts) == [e.name for e in ENTRIES]
    for e in ENTRIES:
        sl = core.state_layout()[e.name]
        assert parts[e.name].shape == (2, *e.shape)
        assert torch.equal(parts[e.name], z[:, sl].reshape(2, *e.shape))
    assert parts["l0/ssm"][1, 2, 1] == z[1, C * (K - 1) + 2 * 2 + 1]  # (channel 2, entry 1): row-major
    assert torch.equal(core.pack(parts), z)
    assert torch.equal(core.pack(dict(reversed(list(parts.items())))), z)  # the entries' order, not the dict's


def test_the_structure_is_one_block_per_entry() -> None:
    core = Toy()
    layout = core.state_layout()
    blocks = core.jacobian_structure().blocks
    assert blocks == tuple(StateBlock(e.name, layout[e.name].start, layout[e.name].stop, e.form, e.size, e.repeat,
                                      e.held) for e in ENTRIES)
    assert blocks[-1].held and not blocks[0].held


def test_the_delta_structure_cuts_each_delta_entry_into_heads() -> None:
    """``…/delta`` (heads, d_v, d_k) → one block_diagonal block per head, size d_k, repeat d_v; the rest as
    before."""
    core = Toy()
    start = core.state_layout()["l1/delta"].start
    blocks = core.delta_structure(HEADS, DK, DV).blocks
    plain = core.jacobian_structure().blocks
    assert blocks[:2] == plain[:2] and blocks[-1] == plain[-1]
    assert blocks[2:4] == tuple(StateBlock(f"l1/delta/h{j}", start + j * DK * DV, start + (j + 1) * DK * DV,
                                           "block_diagonal", DK, DV) for j in range(HEADS))


def test_flat_blocks_flatten_diagonal_entries_only() -> None:
    core = Toy()
    parts = {"l0/conv": randn(2, C, 1, K - 1, K - 1, seed=0), "l0/ssm": randn(2, C, 2, seed=1),
             "l1/delta": randn(2, 12, 12, seed=2), "l1/keys": randn(2, 4, 1, 2, seed=3)}
    out = core.flat_blocks(parts)
    assert out[0] is parts["l0/conv"] and out[2] is parts["l1/delta"]
    assert torch.equal(out[1], parts["l0/ssm"].reshape(2, 6)) and torch.equal(out[3], parts["l1/keys"].reshape(2, 8))


def test_step_and_blocks_all_go_through_advance() -> None:
    core = Toy()
    x, z = randn(2, 3, seed=0), randn(2, core.state_dim, seed=1)
    y, new = core.step(x, z, 4)
    assert torch.equal(y, x + 1) and torch.equal(new, 2 * z)
    assert torch.equal(core.diagonal_blocks(x, z, 5)[0], z[:, :1])
    new2, blocks = core.step_and_blocks(x, z)
    assert torch.equal(new2, 2 * z) and torch.equal(blocks[0], z[:, :1])
    assert core.calls == [(4, False), (5, True), (None, True)]


# --- norms, linear maps, convolutions ------------------------------------------------------------------------------

def test_rms_and_rms_norm_are_torchs_rms_norm() -> None:
    x = randn(B, 4, N, seed=0)
    norm = SimpleNamespace(weight=1 + randn(N, seed=1), variance_epsilon=EPS)
    torch.testing.assert_close(rms(x, EPS), F.rms_norm(x, (N,), eps=EPS), rtol=0, atol=TOL)
    torch.testing.assert_close(rms_norm(norm, x), F.rms_norm(x, (N,), norm.weight, EPS), rtol=0, atol=TOL)
    torch.testing.assert_close(rms(x, 0.0).pow(2).mean(-1), torch.ones(B, 4, dtype=F64), rtol=0, atol=TOL)
    assert rms(x.float(), EPS).dtype == torch.float32  # in x's dtype


def test_rms_jvp_and_vjp_are_torch_funcs() -> None:
    x, dx = randn(B, N, seed=0), randn(M, B, N, seed=1)  # tangents broadcast against x
    y, dy = rms_jvp(x, dx, EPS)
    torch.testing.assert_close(y, rms(x, EPS), rtol=0, atol=TOL)
    for m in range(M):
        ref = jvp(lambda v: rms(v, EPS), (x,), (dx[m],))[1]
        torch.testing.assert_close(dy[m], ref, rtol=0, atol=TOL)
        back = torch.func.vjp(lambda v: rms(v, EPS), x)[1](dx[m])[0]
        torch.testing.assert_close(rms_vjp(x, dx[m], EPS), back, rtol=0, atol=TOL)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_jvp_is_the_layer_and_w_times_the_tangents(bias: bool) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(N, 4, bias=bias, dtype=F64)
    a, da = randn(B, N, seed=1), randn(M, B, N, seed=2)
    with torch.no_grad():
        out, d = linear_jvp(layer, a, da)
        torch.testing.assert_close(out, layer(a), rtol=0, atol=TOL)
        for m in range(M):
            torch.testing.assert_close(d[m], jvp(layer, (a,), (da[m],))[1], rtol=0, atol=TOL)
        out0, none = linear_jvp(layer, a, None)
    assert none is None and torch.equal(out0, layer(a))


def test_norm_linear_jvp_is_the_normed_layers_jvp() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(N, 4, dtype=F64)
    norm = SimpleNamespace(weight=1 + randn(N, seed=1), variance_epsilon=EPS)
    h, dh = randn(B, N, seed=2), randn(M, B, N, seed=3)

    def f(v: Tensor) -> Tensor:
        return layer(F.rms_norm(v, (N,), norm.weight, EPS))

    with torch.no_grad():
        out, d = norm_linear_jvp(norm, layer, h, dh)
        torch.testing.assert_close(out, f(h), rtol=0, atol=TOL)
        for m in range(M):
            torch.testing.assert_close(d[m], jvp(f, (h,), (dh[m],))[1], rtol=0, atol=TOL)
        out0, none = norm_linear_jvp(norm, layer, h, None)
    assert none is None
    torch.testing.assert_close(out0, f(h), rtol=0, atol=TOL)


def test_silu_grad_is_silus_derivative() -> None:
    x = torch.linspace(-6, 6, 25, dtype=F64)
    ref = torch.func.vmap(torch.func.grad(F.silu))(x)
    torch.testing.assert_close(silu_grad(x), ref, rtol=0, atol=TOL)
    assert silu_grad(torch.zeros(1, dtype=F64)).item() == 0.5


def conv(bias: bool) -> nn.Conv1d:
    torch.manual_seed(0)
    return nn.Conv1d(C, C, K, groups=C, bias=bias, dtype=F64)


def conv_out(c: nn.Conv1d, window: Tensor, u: Tensor) -> Tensor:
    """The reference: the depthwise conv1d of [window, u] (K inputs per channel, oldest first), its one output."""
    seq = torch.cat([window, u[..., None]], dim=-1)  # (B, C, K)
    return F.conv1d(seq, c.weight, c.bias, groups=C)[..., 0]


def step_ref(c: nn.Conv1d, window: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """(silu of the conv's output, the shifted window [window[1:], u])."""
    return F.silu(conv_out(c, window, u)), torch.cat([window[..., 1:], u[..., None]], dim=-1)


@pytest.mark.parametrize("bias", [True, False])
def test_conv_pre_is_the_depthwise_conv_at_the_newest_position(bias: bool) -> None:
    c = conv(bias)
    window, u = randn(B, C, K - 1, seed=1), randn(B, C, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(conv_pre(c, window, u), conv_out(c, window, u), rtol=0, atol=TOL)


@pytest.mark.parametrize("with_du", [True, False])
def test_conv_silu_jvp_and_the_window_shift_are_torch_funcs(with_du: bool) -> None:
    c = conv(True)
    window, u = randn(B, C, K - 1, seed=1), randn(B, C, seed=2)
    dwindow, du = randn(M, B, C, K - 1, seed=3), (randn(M, B, C, seed=4) if with_du else None)
    new, dnew = torch.empty(B, C, K - 1, dtype=F64), torch.empty(M, B, C, K - 1, dtype=F64)
    with torch.no_grad():
        out, dout = conv_silu_jvp(c, window, dwindow, u, du)
        shift_window_jvp(new, dnew, window, dwindow, u, du)
        for m in range(M):
            tangent_u = du[m] if du is not None else torch.zeros_like(u)
            (ref_out, ref_new), (ref_dout, ref_dnew) = jvp(lambda w_, u_: step_ref(c, w_, u_), (window, u),
                                                                      (dwindow[m], tangent_u))
            torch.testing.assert_close(dout[m], ref_dout, rtol=0, atol=TOL)
            assert torch.equal(dnew[m], ref_dnew)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=TOL)
    assert torch.equal(new, ref_new)


def test_conv_silu_vjp_is_torch_funcs() -> None:
    """Cotangents on (silu(pre), window') → the window's (written into g_window) and the new input's (returned)."""
    c = conv(True)
    window, u = randn(B, C, K - 1, seed=1), randn(B, C, seed=2)
    g_c, g_new = randn(M, B, C, seed=3), randn(M, B, C, K - 1, seed=4)
    g_window = torch.full((M, B, C, K - 1), float("nan"), dtype=F64)
    with torch.no_grad():
        g_u = conv_silu_vjp(c, conv_pre(c, window, u), g_c, g_new, g_window)
        for m in range(M):
            _, pull = torch.func.vjp(lambda w_, u_: step_ref(c, w_, u_), window, u)
            ref_window, ref_u = pull((g_c[m], g_new[m]))
            torch.testing.assert_close(g_window[m], ref_window, rtol=0, atol=TOL)
            torch.testing.assert_close(g_u[m], ref_u, rtol=0, atol=TOL)


@pytest.mark.parametrize("width", [1, 3])
def test_shift_blocks_are_the_window_shifts_jacobian(width: int) -> None:
    """window' = [window[1:], u] per channel; its Jacobian in window: S[i, i + 1] = 1 (none for a window of one)."""
    like = randn(1, seed=0)
    u = randn(C, seed=1)
    jac = torch.func.jacrev(lambda w_: torch.cat([w_[..., 1:], u[:, None]], dim=-1))(randn(C, width, seed=2))
    ref = torch.stack([jac[ch, :, ch, :] for ch in range(C)])  # (C, width, width): channels do not mix
    got = shift_blocks(B, C, width, like)
    assert got.shape == (B, C, width, width) and got.dtype == F64
    assert torch.equal(got, ref.expand(B, -1, -1, -1))


# --- the input map and the library's forward ------------------------------------------------------------------------

def test_token_map_scales_the_embedding() -> None:
    torch.manual_seed(0)
    emb = nn.Embedding(9, 4, dtype=F64)
    tokens = torch.tensor([[1, 8, 0]])
    assert TokenMap(emb).num_embeddings == 9
    assert torch.equal(TokenMap(emb)(tokens), emb(tokens))
    scaled = TokenMap(emb, lambda x: torch.tensor(2.0, dtype=x.dtype))(tokens)
    assert torch.equal(scaled, 2 * emb(tokens))


def test_hf_forward_gives_logits_or_the_last_hidden_state() -> None:
    seen = []

    def model(**kwargs):  # noqa: ANN003, ANN202
        seen.append(kwargs)
        return SimpleNamespace(logits=kwargs["input_ids"] * 2, last_hidden_state=None)

    def bare(**kwargs):  # noqa: ANN003, ANN202
        return SimpleNamespace(last_hidden_state=kwargs["input_ids"] + 1)

    tokens = torch.tensor([[1, 2]])
    assert torch.equal(hf_forward(model)(tokens), tokens * 2)
    assert seen[0]["use_cache"] is False and seen[0]["input_ids"] is tokens
    assert torch.equal(hf_forward(bare)(tokens), tokens + 1)


def test_adapt_backbone_reads_the_backbone_and_refuses_a_model_without_one() -> None:
    emb = nn.Embedding(5, 2)
    backbone = SimpleNamespace(layers=[], norm_f=None, embeddings=emb)
    made = []
    head = nn.Linear(2, 5)
    adapted = adapt_backbone(SimpleNamespace(backbone=backbone, lm_head=head), lambda b: made.append(b) or "core",
                             "Mamba", 1e-4)
    assert made == [backbone] and adapted.core == "core" and adapted.readout is head and adapted.tolerance == 1e-4
    assert adapted.inputs.embedding is emb
    assert adapt_backbone(backbone, lambda b: "bare", "Mamba", 0.0).readout is None  # a bare model: no head

    class Other:
        pass

    with pytest.raises(GradscopeError, match=r"^model: Other has no Mamba backbone \(layers, norm_f\)$"):
        adapt_backbone(Other(), lambda b: "core", "Mamba", 1e-4)


# --- the wrap-time agreement check ----------------------------------------------------------------------------------

def test_agreement_tolerance_known_values() -> None:
    eps = torch.finfo(torch.float32).eps
    assert agreement_tolerance(1, torch.float32) == MARGIN * ERROR_COEF * eps == 48 * eps
    assert agreement_tolerance(4, torch.float32) == 48 * eps * 8  # depth^1.5
    assert agreement_tolerance(1, torch.int64) == 48 * eps  # a non-float dtype: float32's eps
    assert agreement_tolerance(1, torch.float16) == HALF_CAP  # 48 · 2^-10 capped
    assert agreement_tolerance(1, torch.float32, floor=0.5) == 0.5  # a floor above the cap wins
    with pytest.raises(GradscopeError, match=r"^depth: got 2.0; expected a positive number of layers$"):
        agreement_tolerance(2.0, torch.float32)  # type: ignore[arg-type]


def test_check_against_library_returns_the_relative_difference() -> None:
    theirs = torch.tensor([[4.0, -2.0]], dtype=F64)
    assert check_against_library(lambda e: theirs.clone(), lambda e: theirs, torch.zeros(1), 1e-9, "x") == 0.0
    ours = theirs + torch.tensor([[0.0, 1e-3]], dtype=F64)
    assert check_against_library(lambda e: ours, lambda e: theirs, torch.zeros(1), 1e-3, "x") == pytest.approx(
        1e-3 / 4, rel=1e-9)  # relative to the largest magnitude
    small = torch.tensor([[0.25]], dtype=F64)  # scale at least 1
    assert check_against_library(lambda e: small + 1e-3, lambda e: small, torch.zeros(1), 1e-2, "x") == pytest.approx(
        1e-3, rel=1e-9)


def test_check_against_library_calls_the_library_first_in_no_grad() -> None:
    order = []

    def library(e: Tensor) -> Tensor:
        order.append(("library", torch.is_grad_enabled()))
        return e.float()

    def wrapped(e: Tensor) -> Tensor:
        order.append(("wrapped", torch.is_grad_enabled()))
        return e.double()

    assert check_against_library(wrapped, library, torch.ones(1, 2), 1e-9, "x") == 0.0  # theirs cast to our dtype
    assert order == [("library", False), ("wrapped", False)]


def test_check_against_library_refuses_in_one_line() -> None:
    theirs = torch.tensor([[4.0, -2.0]], dtype=F64)
    with pytest.raises(GradscopeError, match=r"^model: gradscope's toy adapter and the library's own forward disagree "
                                             r"by 1\.00e-01 \(> 0\.01 × 4 \(here\)\) on a small batch") as err:
        check_against_library(lambda e: theirs + 0.1, lambda e: theirs, torch.zeros(1), 1e-2, "toy", " (here)")
    assert "\n" not in str(err.value)
    with pytest.raises(GradscopeError, match=r"the adapter gives outputs \(1, 3\), the library \(1, 2\); this toy"):
        check_against_library(lambda e: torch.zeros(1, 3), lambda e: theirs, torch.zeros(1), 1e-2, "toy")


def test_check_against_library_on_nonfinite_outputs() -> None:
    """NaN/Inf in the same places: the rest compared; in other places: refused; nothing finite: NaN."""
    theirs = torch.tensor([[1.0, math.nan, math.inf, 3.0]], dtype=F64)
    ours = theirs + torch.tensor([[0.0, 0.0, 0.0, 0.03]], dtype=F64)
    assert check_against_library(lambda e: ours, lambda e: theirs, torch.zeros(1), 0.1, "x") == pytest.approx(
        0.01, rel=1e-9)
    with pytest.raises(GradscopeError, match="NaN or Inf in different places"):
        check_against_library(lambda e: ours.nan_to_num(nan=0.0), lambda e: theirs, torch.zeros(1), 0.1, "x")
    allnan = torch.full((1, 2), math.nan, dtype=F64)
    assert math.isnan(check_against_library(lambda e: allnan, lambda e: allnan, torch.zeros(1), 0.1, "x"))
