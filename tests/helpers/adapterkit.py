"""Brute force through a library's OWN forward and cache, written without the adapter, and the checks
every library family runs against it (tests/models/adapters/test_hf_*.py).

A family gives two functions over the library model, in the layout the docs state for it (a list
of per-sequence tensors, in the documented order):

- ``state(tokens) → parts``: the library's own cache/state after running ``tokens`` (B, p);
- ``step(parts, columns, t0) → (y, parts')``: the tokens ``columns`` (B, n), the first at 0-based
  position t0, through the library's own forward starting from ``parts`` (the cache rebuilt from
  them), returning the output y (B, H) after the last of them (what the adapter's core outputs: the
  backbone's last hidden state) and the new parts.

Everything runs in float64 (the libraries round to float32 in places, which bounds the agreement at
~1e-7 relative). J = ∂y_T/∂z_p comes from reverse mode (one autograd.grad per output row) or, for a
library whose cache writes defeat reverse mode (``reverse=False``: RWKV writes back into the very
tensors its maximum saved), from forward mode on a batch repeated D times (row b·D + j carries the
tangent e_j); the step Jacobians J_t always come from forward mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

import gradscope
from gradscope.analysis.dynamics import gradient_flow
from gradscope.analysis.lyapunov import lyapunov_spectrum
from gradscope.models.core import diagonal_blocks, initial_state, step_and_blocks, step_at

Parts = list[Tensor]


@dataclass
class Family:
    model: torch.nn.Module  # the library model (float64, eval)
    state: Callable[[Tensor], Parts]
    step: Callable[[Parts, Tensor, int], tuple[Tensor, Parts]]
    vocab: int
    reverse: bool = True  # J = ∂y_T/∂z_p by reverse mode (else forward mode)
    forward_steps: bool = True  # J_t by forward mode (else one reverse pass per row: a library
    # autograd.Function without a jvp, such as RecurrentGemma's SqrtBoundDerivative, defeats forward mode)


def flat(parts: Parts) -> Tensor:
    """The test's own flattening: each part (B, *shape) row-major, in order → (B, D)."""
    return torch.cat([p.reshape(p.shape[0], -1) for p in parts], dim=1)


def library_jacobian(fam: Family, tokens: Tensor, p: int) -> tuple[Tensor, Tensor]:
    """(J = ∂y_T/∂z_p (B, H, D), z_p (B, D)) through the library: its state after tokens[:, :p], then
    steps p+1 … T from leaves in that state, one autograd.grad per output row."""
    B, T = tokens.shape
    with torch.no_grad():
        parts = fam.state(tokens[:, :p])
    if not fam.reverse:
        return _forward_jacobian(fam, tokens, p, parts)[0], flat(parts).detach()
    leaves = [q.detach().clone().requires_grad_(True) for q in parts]
    with torch.enable_grad():
        cur = [q.clone() for q in leaves]  # the library may write into what it is given
        y, cur = fam.step(cur, tokens[:, p:], p)
        rows = []
        for i in range(y.shape[1]):
            grads = torch.autograd.grad(y[:, i].sum(), leaves, retain_graph=True, allow_unused=True)
            rows.append(flat([torch.zeros_like(q) if g is None else g for g, q in zip(grads, leaves)]))
    return torch.stack(rows, dim=1), flat(parts).detach()


def _forward_jacobian(fam: Family, tokens: Tensor, p: int, parts: Parts) -> tuple[Tensor, Tensor, Parts]:
    """(∂y/∂z_p (B, H, D), ∂z'/∂z_p (B, D, D), z') after tokens[:, p:] from ``parts``, by forward mode."""
    B = tokens.shape[0]
    widths = [q[0].numel() for q in parts]
    D = sum(widths)
    tangents = torch.eye(D, dtype=torch.float64).repeat(B, 1).split(widths, dim=1)  # (B·D, w) each
    with fwAD.dual_level():
        duals = [fwAD.make_dual(q.repeat_interleave(D, 0).contiguous(), tg.reshape(B * D, *q.shape[1:]).contiguous())
                 for q, tg in zip(parts, tangents)]
        with torch.backends.mkldnn.flags(enabled=False):  # float64 depthwise conv1d: 3× faster without oneDNN
            y, new = fam.step(duals, tokens[:, p:].repeat_interleave(D, 0), p)
        cols, out = [], []
        for n in [y, *new]:
            primal, tangent = fwAD.unpack_dual(n)
            cols.append((torch.zeros_like(primal) if tangent is None else tangent).reshape(B * D, -1))
            out.append(primal.reshape(B, D, *n.shape[1:])[:, 0].detach().clone())
    H = y.shape[-1]
    jac = torch.cat(cols, dim=1).reshape(B, D, -1).transpose(1, 2).detach()  # rows: outputs, columns: z_p
    return jac[:, :H], jac[:, H:], out[1:]


def _reverse_step_jacobian(fam: Family, column: Tensor, t: int, parts: Parts) -> tuple[Tensor, Parts]:
    """(∂z'/∂z (B, D, D), z') of one token from ``parts`` by one autograd.grad per row of z'."""
    leaves = [q.detach().clone().requires_grad_(True) for q in parts]
    with torch.enable_grad():
        _, new = fam.step([q.clone() for q in leaves], column, t)
        out = flat(new)
        rows = []
        for i in range(out.shape[1]):
            grads = torch.autograd.grad(out[:, i].sum(), leaves, retain_graph=True, allow_unused=True)
            rows.append(flat([torch.zeros_like(q) if g is None else g for g, q in zip(grads, leaves)]))
    return torch.stack(rows, dim=1).detach(), [q.detach().clone() for q in new]


def library_step_jacobians(fam: Family, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """(J_t (B, T−1, D, D), log|det J_t| in float64 (B, T−1)) for t = 2 … T along the library's own
    trajectory: J_t at the library's state after t − 1 tokens, by forward-mode AD. (J_1, at the
    initial state, is left out: the checks count steps after a warm-up of at least one.)"""
    B, T = tokens.shape
    with torch.no_grad():
        parts = fam.state(tokens[:, :1])  # the state after token 1
    Js = []
    for t in range(1, T):  # J_{t+1}: from the state after t tokens
        if fam.forward_steps:
            _, J, parts = _forward_jacobian(fam, tokens[:, :t + 1], t, parts)
        else:
            J, parts = _reverse_step_jacobian(fam, tokens[:, t:t + 1], t, parts)
        Js.append(J)
    J = torch.stack(Js, dim=1).detach()
    return J, torch.linalg.slogdet(J).logabsdet


def stability_score(a: Tensor, b: Tensor) -> float:
    """SPEC §4's default score of two Jacobians (H, D)."""
    return float((a * b).sum() / (a.norm(dim=1) * b.norm(dim=1)).sum())


def probes(vocab: int, n: int, L: int, p: int, seed: int) -> Tensor:
    """n triplets (base, same-target, same-suffix) (n, 3, L) around target position p."""
    tok = torch.randint(0, vocab, (n, 3, L), generator=torch.Generator().manual_seed(seed))
    tok[:, 1, :p] = tok[:, 0, :p]
    tok[:, 2, p:] = tok[:, 0, p:]
    return tok


# ---------------------------------------------------------------------------------------------
# The checks each family runs

def check_state_jacobian(fam: Family, model: torch.nn.Module, tokens: Tensor, p: int, method: str,
                         rtol: float) -> float:
    """gradscope's J and z_p equal the library's; returns the relative error."""
    res = gradscope.state_jacobian(model, tokens, p, method=method)
    ref, z_p = library_jacobian(fam, tokens, p)
    assert res.jac.shape == ref.shape, (res.jac.shape, ref.shape)
    scale = float(ref.abs().max())
    assert scale > 1e-4  # not comparing zeros
    assert float((res.state - z_p).abs().max()) <= rtol * max(1.0, float(z_p.abs().max())), "z_p differs"
    err = float((res.jac - ref).abs().max()) / scale
    assert err <= rtol, f"J off by {err:.2e} (relative) at p={p}, method={method}"
    return err


def check_stability(fam: Family, model: torch.nn.Module, L: int, p: int, rtol: float) -> None:
    """gradscope.stability's same-target and same-suffix scores equal SPEC §4's formula on the library's Jacobians."""
    tok = probes(fam.vocab, 2, L, p, seed=5)
    ds = gradscope.stability(model, probes=tok, target_pos=p)
    for i in range(tok.shape[0]):
        ref, _ = library_jacobian(fam, tok[i], p)
        for pair, member in (("same-target", 1), ("same-suffix", 2)):
            expected = stability_score(ref[0], ref[member])
            got = float(ds["score_default"].sel(pair=pair).isel(checkpoint=0, triplet=i))
            assert abs(got - expected) <= rtol, (pair, i, got, expected)


def check_gradient_flow(fam: Family, model: torch.nn.Module, tokens: Tensor, rtol: float) -> None:
    """g(k) = ‖∂y_T/∂z_k‖_F for every k < T equals the norm of the library's Jacobian."""
    fro, _ = gradient_flow(model, tokens)
    T = tokens.shape[1]
    for k in range(1, T):
        ref = torch.linalg.matrix_norm(library_jacobian(fam, tokens, k)[0])
        assert float(((fro[:, k - 1] - ref).abs() / ref).max()) <= rtol, (k, fro[:, k - 1], ref)


def check_lyapunov_sum(fam: Family, model: torch.nn.Module, tokens: Tensor, warmup: int, atol: float) -> None:
    """Σλ against the mean log|det J_t| of the library's own step Jacobians (−inf where it is −inf), and
    the declared structure: J_t is block lower-triangular over the layout's blocks, and the exponents
    are the time averages of log|J_t[i, i]| (blocks that are diagonal in the library's J_t) or, for
    blocks that are not, their own log|det| averages."""
    core = model.core
    with torch.no_grad():
        x = model.core_inputs(tokens)
        z = initial_state(core, x.shape[0], x)
        for t in range(x.shape[1]):  # the engine's one-pass step and blocks = step and diagonal_blocks, bit for bit
            new, blocks = step_and_blocks(core, x[:, t], z, t)
            assert torch.equal(new, step_at(core, x[:, t], z, t)[1])
            assert all(torch.equal(a, b) for a, b in zip(blocks, diagonal_blocks(core, x[:, t], z, t), strict=True))
            z = new
    res = lyapunov_spectrum(core, x, warmup=warmup, sum_check=True)
    assert warmup >= 1
    J, logdet = library_step_jacobians(fam, tokens)
    counted = slice(warmup - 1, None)  # J[:, i] is the step that reads token i + 2 (1-based), gradscope's step i + 1
    ref_sum = logdet[:, counted].mean(dim=1)  # (B,)
    lam_sum = res.exponents.sum(dim=-1)
    for b in range(tokens.shape[0]):
        if torch.isneginf(ref_sum[b]):
            assert torch.isneginf(lam_sum[b]), (lam_sum[b], ref_sum[b])
        else:
            assert abs(float(lam_sum[b] - ref_sum[b])) <= atol, (lam_sum[b], ref_sum[b])
    assert torch.allclose(res.log_det_mean, ref_sum, atol=atol, rtol=0) or bool(
        (torch.isneginf(res.log_det_mean) == torch.isneginf(ref_sum)).all())
    blocks = core.jacobian_structure().blocks
    finite_ref = []
    for i, blk in enumerate(blocks):
        own = J[..., blk.start:blk.stop, blk.start:blk.stop]
        later = J[..., blk.start:blk.stop, blk.stop:]
        scale = float(J.abs().max())
        assert later.numel() == 0 or float(later.abs().max()) <= 1e-9 * scale, f"{blk.name} reads a later block"
        if blk.form == "diagonal":
            off = own - torch.diag_embed(own.diagonal(dim1=-2, dim2=-1))
            assert float(off.abs().max()) <= 1e-9 * scale, f"{blk.name} is not diagonal in the library's J_t"
            finite_ref.append(own.diagonal(dim1=-2, dim2=-1).abs().log()[:, counted].mean(dim=1))  # (B, n)
    ref_exps = torch.cat(finite_ref, dim=1).sort(dim=1, descending=True).values  # diagonal blocks' exponents
    diag_widths = sum(b.width for b in blocks if b.form == "diagonal")
    assert ref_exps.shape[1] == diag_widths
    # gradscope's exponents of the diagonal blocks: the structured engine's union; compare as sorted sets
    # against the union of the library's per-entry averages plus the other blocks' (checked via the sum)
    got = res.exponents
    for b in range(tokens.shape[0]):
        ref_b = ref_exps[b]
        for value in ref_b[torch.isfinite(ref_b)]:
            assert float((got[b] - value).abs().min()) <= atol, (float(value), got[b])
        assert int(torch.isneginf(got[b]).sum()) >= int(torch.isneginf(ref_b).sum())


def conv_cache_family(model: torch.nn.Module, *, reverse: bool = True, upcast: bool = False) -> Family:
    """A transformers model whose cache holds, per layer, a conv window of K inputs (of which the oldest is
    never read) and a recurrent state (Mamba, Mamba-2), in the documented layout: per layer the window
    without its oldest entry, then the state. ``upcast``: the library leaves its state in float32 after a
    chunked forward (Mamba-2), so the parts are taken in float64; ``reverse`` False where its one-token
    path writes the state in place over a tensor its own product saved (Mamba-2)."""
    bb = getattr(model, "backbone", model)
    L = len(bb.layers)

    def read(cache) -> list[Tensor]:  # noqa: ANN001
        out = []
        for l in range(L):
            out += [cache.layers[l].conv_states[0][:, :, 1:], cache.layers[l].recurrent_states[0]]
        return out

    def state(tokens: Tensor) -> list[Tensor]:
        parts = [q.clone() for q in read(bb(input_ids=tokens, use_cache=True).cache)]
        return [q.double() for q in parts] if upcast else parts

    def step(parts: list[Tensor], columns: Tensor, t0: int):  # noqa: ANN202
        with torch.no_grad():
            cache = bb(input_ids=columns[:, :1], use_cache=True).cache  # a cache of the right batch, overwritten
        for l in range(L):
            old = cache.layers[l].conv_states[0]
            cache.layers[l].conv_states[0] = torch.cat([torch.zeros_like(old[:, :, :1]), parts[2 * l]], dim=-1)
            cache.layers[l].recurrent_states[0] = parts[2 * l + 1].clone()
        for t in range(columns.shape[1]):  # the one-token (recurrent) path, token by token
            y = bb(input_ids=columns[:, t:t + 1], cache=cache, use_cache=True).last_hidden_state[:, -1]
        return y, read(cache)

    return Family(model, state, step, int(model.config.vocab_size), reverse=reverse)


def check_changed_mixer_refused(model: torch.nn.Module) -> None:
    """A model whose first mixer's forward was changed (× 1.5) is refused at wrap time, in one line."""
    from gradscope.errors import GradscopeError

    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):  # noqa: ANN001, ANN202
        return 1.5 * type(self).forward(self, hidden_states, cache=cache, attention_mask=attention_mask)

    mixer = getattr(model, "backbone", model).layers[0].mixer
    mixer.forward = forward.__get__(mixer)
    try:
        gradscope.wrap(model)
    except GradscopeError as err:
        assert "disagree" in str(err) and "\n" not in str(err)
    else:
        raise AssertionError("a changed mixer was not refused")


def check_own_step_tangents(core: torch.nn.Module, x: Tensor, z: Tensor, dz: Tensor) -> None:
    """A core's own ``step_tangents`` against ``torch.func`` (float64, to 1e-12): returned, and written into
    given buffers (NaN-filled, so an entry left unwritten fails) that come back as the outputs."""
    from gradscope.models.core import generic_step_tangents, step_tangents

    with torch.no_grad():
        ref = generic_step_tangents(core, x, z, dz)
        ours = step_tangents(core, x, z, dz)
        out = (torch.full_like(z, float("nan")), torch.full_like(dz, float("nan")))
        into = step_tangents(core, x, z, dz, out=out)
    for a, b, c in zip(ours, ref, into):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(c, b, rtol=1e-12, atol=1e-13)
    assert into[1] is out[0] and into[3] is out[1]


def conv_state_parts(layer) -> list[Tensor]:  # noqa: ANN001 - a transformers linear-attention cache layer
    """A recurrent cache layer's parts in the documented layout: its conv window without the oldest input, then
    its recurrent state, both in float64 (the libraries leave them in float32 after a chunked forward)."""
    return [layer.conv_states[0][:, :, 1:].double(), layer.recurrent_states[0].double()]


def set_conv_state_parts(layer, parts) -> None:  # noqa: ANN001 - a cache layer and an iterator of parts
    """The inverse of :func:`conv_state_parts`: the window (an unread oldest input of zeros), then the state."""
    window = next(parts)
    layer.conv_states[0] = torch.cat([torch.zeros_like(window[:, :, :1]), window], dim=-1)
    layer.recurrent_states[0] = next(parts).clone()


def hybrid_family(model: torch.nn.Module, types: list[str], positions: int, *, reverse: bool = True,
                  explicit_positions: bool = False, read_recurrent: Callable = conv_state_parts,
                  write_recurrent: Callable = set_conv_state_parts) -> Family:
    """A transformers model with recurrent layers (``linear_attention``), attention layers (``full_attention``)
    and stateless ones (anything else), through its own ``DynamicCache``: per recurrent layer
    ``read_recurrent(cache layer)``, per attention layer its keys and values (positions, H_kv, d) zero-padded
    beyond the tokens read. ``step`` runs the library's one-token path token by token from a cache set to the
    parts (``explicit_positions``: pass each token's position, for a library forward that does not count the
    cache's)."""
    bb = getattr(model, "model", getattr(model, "backbone", model))

    def read(cache) -> list[Tensor]:  # noqa: ANN001
        out: list[Tensor] = []
        for l, kind in enumerate(types):
            layer = cache.layers[l]
            if kind == "linear_attention":
                out += read_recurrent(layer)
            elif kind == "full_attention":
                for kv in (layer.keys, layer.values):  # (B, H_kv, n, d) → (B, positions, H_kv, d)
                    pad = kv.new_zeros(kv.shape[0], kv.shape[1], positions - kv.shape[2], kv.shape[3])
                    out.append(torch.cat([kv, pad], dim=2).transpose(1, 2))
        return out

    def state(tokens: Tensor) -> list[Tensor]:
        return [q.clone() for q in read(bb(input_ids=tokens, use_cache=True).cache)]

    def step(parts: list[Tensor], columns: Tensor, t0: int):  # noqa: ANN202
        with torch.no_grad():
            cache = bb(input_ids=columns[:, :1], use_cache=True).cache  # a cache of the right batch, overwritten
        it = iter(parts)
        for l, kind in enumerate(types):
            layer = cache.layers[l]
            if kind == "linear_attention":
                write_recurrent(layer, it)
            elif kind == "full_attention":
                layer.keys, layer.values = (next(it)[:, :t0].transpose(1, 2).contiguous() for _ in range(2))
        for t in range(columns.shape[1]):  # the one-token path, token by token
            extra = {"position_ids": torch.full((columns.shape[0], 1), t0 + t, dtype=torch.long)} \
                if explicit_positions else {}
            y = bb(input_ids=columns[:, t:t + 1], cache=cache, use_cache=True, **extra).last_hidden_state[:, -1]
        return y, read(cache)

    return Family(model, state, step, int(model.config.vocab_size), reverse=reverse)


def check_declared_blocks(core: torch.nn.Module, x: Tensor, steps: int) -> None:
    """At each of the first ``steps`` steps, J_t from torch.func (the whole matrix) restricted to each declared
    block equals the block the core gives, and no block reads a later one (J_t lower-triangular)."""
    from gradscope.models.core import generic_step_jacobian

    B = x.shape[0]
    with torch.no_grad():
        z = initial_state(core, B, x)
        for t in range(steps):
            J = generic_step_jacobian(core, x[:, t], z, t)
            for blk, d in zip(core.jacobian_structure().blocks, diagonal_blocks(core, x[:, t], z, t), strict=True):
                own = J[:, blk.start:blk.stop, blk.start:blk.stop]
                if blk.form == "diagonal":
                    dense = torch.diag_embed(d.expand(B, blk.width))
                else:  # block_diagonal: (B, n/size, size, size)
                    dense = torch.stack([torch.block_diag(*d[b]) for b in range(B)])
                torch.testing.assert_close(own, dense, rtol=1e-10, atol=1e-12, msg=f"{blk.name} at t={t}")
                later = J[:, blk.start:blk.stop, blk.stop:]
                assert later.numel() == 0 or float(later.abs().max()) == 0.0, f"{blk.name} reads a later block"
            z = step_at(core, x[:, t], z, t)[1]


def check_hybrid(fam: Family, model: torch.nn.Module, tokens: Callable[..., Tensor], rtol: float) -> None:
    """A model with attention caches in its state: J = ∂y_T/∂z_p against the library's cache at three
    positions and three engines, both stability pairs against §4's formula on the library's Jacobians,
    S(A, A) = 1, and the score unchanged when the state's entries are permuted (recurrent states and cache
    slots mixed). ``tokens(seed, length=…)`` draws token ids (B, T)."""
    from gradscope.analysis.scores import default_score

    T = tokens(1).shape[1]
    for p, method in ((1, "vjp"), (3, "func"), (T - 1, "auto")):
        check_state_jacobian(fam, model, tokens(1), p, method, rtol)
    check_stability(fam, model, L=5, p=2, rtol=1e-6)
    jac = gradscope.state_jacobian(model, tokens(5), position=3).jac
    same = default_score(jac, jac)
    assert torch.allclose(same, torch.ones_like(same), rtol=0, atol=1e-12)
    other = gradscope.state_jacobian(model, tokens(6), position=3).jac
    perm = torch.randperm(jac.shape[-1], generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(default_score(jac[..., perm], other[..., perm]), default_score(jac, other),
                               rtol=1e-12, atol=1e-14)


def check_held_spectrum(core: torch.nn.Module, x: Tensor, finite: int, minus_inf: int) -> None:
    """The declared blocks are J_t's own (:func:`check_declared_blocks`), and the Lyapunov spectrum with the
    attention caches held has the recurrent blocks' entries only: ``finite`` finite exponents and
    ``minus_inf`` exactly −∞ (shift registers) in each row."""
    check_declared_blocks(core, x, steps=4)
    with torch.no_grad():
        lam = lyapunov_spectrum(core, x, warmup=2).exponents
    recurrent = sum(b.width for b in core.jacobian_structure().blocks if not b.held)
    assert lam.shape == (x.shape[0], recurrent) and finite + minus_inf == recurrent
    for row in lam:
        assert int(torch.isfinite(row).sum()) == finite and int(torch.isneginf(row).sum()) == minus_inf
