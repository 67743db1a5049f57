"""What every library adapter shares: a named flat state, its Jacobian structure, and the wrap-time check.

An adapter is a :class:`~gradscope.models.core.Core` that holds the library model by reference (its
modules are registered as a submodule, so ``.double()`` or ``.to(device)`` on the wrapped model
converts the library model itself; nothing is copied) and writes one step of the library's
recurrence as plain torch operations on those modules' weights. Plain torch, because the libraries'
own one-token paths write their caches in place, cast to float32, or run legacy
``autograd.Function`` s, none of which ``torch.func`` can transform.

The state z (B, D) is the concatenation of named entries (:class:`Entry`), each flattened row-major
from its per-sequence shape: ``l0/conv`` (I, K−1), ``l0/ssm`` (I, N), …. The entries are also the
blocks of the declared Jacobian structure (:mod:`gradscope.models.structure`), in an order in
which every entry's new value reads only its own and earlier entries' old values.

Checked at wrap time (:func:`check_against_library`): the wrapped model's outputs (logits for a
``…ForCausalLM``) equal the library's own full-sequence forward on a small seeded batch of token ids,
within :func:`agreement_tolerance` of the model's depth and dtype (never below the adapter's stated
floor); then the protocol checks of :mod:`gradscope.models.protocol`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradscope.errors import GradscopeError, check
from gradscope.guard import same_nonfinite
from gradscope.models.core import Core
from gradscope.models.structure import DEFAULT_FORM, JacobianStructure, StateBlock


@dataclass(frozen=True)
class Entry:
    """One named entry of the state: per-sequence ``shape``, flattened row-major; ``form`` and
    ``size`` of J_t's own block on it (see :class:`~gradscope.models.structure.StateBlock`)."""

    name: str
    shape: tuple[int, ...]
    form: str = DEFAULT_FORM
    size: int = 1
    repeat: int = 1  # block_diagonal: consecutive blocks that are one block repeated (StateBlock.repeat)
    held: bool = False  # an attention cache: held as an input along the trajectory by the spectra (StateBlock.held)

    @property
    def width(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


class LibraryCore(Core):
    """Base of the adapters: the entries, their slices and structure, pack/unpack of z."""

    library: ClassVar[str] = ""  # "transformers" or "mambapy"
    family: ClassVar[str] = ""  # the model family, as the docs name it

    def __init__(self, model: nn.Module, entries: list[Entry], out_dim: int) -> None:
        super().__init__()
        self.model = model  # the library model, by reference
        self.entries = tuple(entries)
        self.state_dim = sum(e.width for e in entries)
        self.out_dim = int(out_dim)
        self._slices: dict[str, slice] = {}
        start = 0
        for e in self.entries:
            self._slices[e.name] = slice(start, start + e.width)
            start += e.width

    def state_layout(self) -> dict[str, slice]:
        """Named slices of z, in order (``l0/conv``, ``l0/ssm``, …)."""
        return dict(self._slices)

    def jacobian_structure(self) -> JacobianStructure:
        """One block per entry, lower-triangular in the entries' order."""
        return JacobianStructure(tuple(StateBlock(e.name, self._slices[e.name].start, self._slices[e.name].stop,
                                                  e.form, e.size, e.repeat, e.held) for e in self.entries))

    def delta_structure(self, heads: int, dk: int, dv: int) -> JacobianStructure:
        """:meth:`jacobian_structure` with every gated-delta-rule entry (``…/delta``, laid out (heads, d_v, d_k))
        one block per head (``l<i>/delta/h<j>``): a head's block is its own d_k × d_k M_t repeated d_v times
        (``block_diagonal``, size d_k, repeat d_v), given by ``diagonal_blocks`` as an expanded view of one
        matrix (no d_v copies in memory: at real size they were GBs a step)."""
        blocks = []
        for e in self.entries:
            sl = self._slices[e.name]
            if e.name.endswith("/delta"):
                blocks += [StateBlock(f"{e.name}/h{j}", sl.start + j * dk * dv, sl.start + (j + 1) * dk * dv,
                                      "block_diagonal", dk, dv) for j in range(heads)]
            else:
                blocks.append(StateBlock(e.name, sl.start, sl.stop, e.form, e.size, e.repeat, e.held))
        return JacobianStructure(tuple(blocks))

    def unpack(self, z: Tensor) -> dict[str, Tensor]:
        """z (B, D) → entry name → (B, *shape) (views where possible). One ``torch.split``, not a slice per
        entry: a slice's backward writes its gradient into zeros of z's full width, so a reverse product
        through every entry made one (B, D) zero tensor per entry and cotangent row; split's backward
        joins the pieces' gradients once."""
        pieces = torch.split(z, [e.width for e in self.entries], dim=1)
        return {e.name: p.reshape(z.shape[0], *e.shape) for e, p in zip(self.entries, pieces)}

    def pack(self, parts: dict[str, Tensor]) -> Tensor:
        """entry name → (B, *shape) → z (B, D), in the entries' order."""
        B = next(iter(parts.values())).shape[0]
        return torch.cat([parts[e.name].reshape(B, e.width) for e in self.entries], dim=1)

    def flat_blocks(self, parts: dict[str, Tensor]) -> list[Tensor]:
        """Compact diagonal blocks in the entries' order (see :mod:`gradscope.models.structure`): a
        diagonal entry's (B, *shape) → (B, n); per-head blocks stay (B, n/size, size, size)."""
        out = []
        for e in self.entries:
            d = parts[e.name]
            out.append(d.reshape(d.shape[0], -1) if e.form == "diagonal" else d)
        return out

    def step(self, x: Tensor, z: Tensor, t: int | None = None) -> tuple[Tensor, Tensor]:
        y, new, _ = self.advance(x, z, t, diagonal=False)
        return y, new

    def diagonal_blocks(self, x: Tensor, z: Tensor, t: int | None = None) -> list[Tensor]:
        """J_t's own block of every entry, from the step's own intermediates (no torch.func)."""
        return self.advance(x, z, t, diagonal=True)[2]

    def step_and_blocks(self, x: Tensor, z: Tensor, t: int | None = None) -> tuple[Tensor, list[Tensor]]:
        """(z', the diagonal blocks) from one pass (:func:`gradscope.models.core.step_and_blocks`)."""
        _, new, blocks = self.advance(x, z, t, diagonal=True)
        return new, blocks

    def advance(self, x: Tensor, z: Tensor, t: int | None, diagonal: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
        """One step: x (B, in), z (B, D) → (y (B, H), z' (B, D), the diagonal blocks when asked, else [])."""
        raise NotImplementedError


def shift_blocks(batch: int, channels: int, width: int, like: Tensor) -> Tensor:
    """J's own block of a conv window of ``width`` past inputs per channel, oldest first, that shifts by
    one each step (the newest entry is the new input, read from outside the window): a nilpotent
    shift S[i, i+1] = 1 per channel → (B, channels, width, width)."""
    S = torch.diag(like.new_ones(width - 1), diagonal=1) if width > 1 else like.new_zeros(1, 1)
    return S.expand(batch, channels, width, width)


def rms(x: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x²) + eps) over the last axis, in x's dtype (the libraries' RMSNorms without their
    float32 round trip)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(module: nn.Module, x: Tensor) -> Tensor:
    """A library's RMSNorm module (``weight``, ``variance_epsilon``) in x's dtype: w · x / rms(x) (the libraries
    round it to float32; this does not)."""
    return rms(x, module.variance_epsilon) * module.weight


def rms_jvp(x: Tensor, dx: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """:func:`rms` and its forward-mode product for tangents dx (…, n) broadcasting against x: with
    r = 1/sqrt(mean(x²) + eps), d(x r) = r dx − x r³ mean(x dx)."""
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    y = x * r
    return y, dx * r - y * (r * r * (x * dx).mean(-1, keepdim=True))


def linear_jvp(layer: nn.Linear, a: Tensor, da: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """``layer(a)`` and its tangents ``W da`` (m, B, in) from one matrix product (no bias on tangents)."""
    if da is None:
        return layer(a), None
    both = F.linear(torch.cat([a[None], da]), layer.weight)
    out = both[0] if layer.bias is None else both[0] + layer.bias
    return out, both[1:]


def norm_linear_jvp(norm: nn.Module, layer: nn.Linear, h: Tensor, dh: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """``layer(RMSNorm(h))`` (the norm's weight and ``variance_epsilon``) and its tangents for dh (m, …) or
    None (no tangent): a Mamba block's input projection."""
    if dh is None:
        return layer(rms(h, norm.variance_epsilon) * norm.weight), None
    hn, dhn = rms_jvp(h, dh, norm.variance_epsilon)
    return linear_jvp(layer, hn * norm.weight, dhn * norm.weight)


def silu_grad(x: Tensor) -> Tensor:
    """d silu(x)/dx = σ(x)(1 + x(1 − σ(x)))."""
    sig = torch.sigmoid(x)
    return sig * (1 + x * (1 - sig))


def conv_pre(conv: nn.Conv1d, window: Tensor, u: Tensor) -> Tensor:
    """A depthwise causal conv's output before its activation, one step: the window (…, C, K−1) of past
    inputs, oldest first, then the new input u (…, C); plus the bias."""
    w = conv.weight[:, 0, :]  # (C, K): the window's K − 1 inputs, then u
    pre = (window * w[:, :-1]).sum(-1) + u * w[:, -1]
    return pre if conv.bias is None else pre + conv.bias


def conv_silu_jvp(conv: nn.Conv1d, window: Tensor, dwindow: Tensor, u: Tensor,
                  du: Tensor | None) -> tuple[Tensor, Tensor]:
    """silu(:func:`conv_pre`) and its tangents for window tangents dwindow (m, …, C, K−1) and input
    tangents du (m, …, C) or None (no tangent)."""
    w = conv.weight[:, 0, :]
    pre = conv_pre(conv, window, u)
    dpre = (dwindow * w[:, :-1]).sum(-1) + (0 if du is None else du * w[:, -1])
    return F.silu(pre), dpre * silu_grad(pre)


def shift_window_jvp(new: Tensor, dnew: Tensor, window: Tensor, dwindow: Tensor, u: Tensor,
                     du: Tensor | None) -> None:
    """Write window' = [window[1:], u] and its tangents into ``new`` (…, C, K−1) and ``dnew``."""
    new[..., :-1], new[..., -1] = window[..., 1:], u
    dnew[..., :-1] = dwindow[..., 1:]
    dnew[..., -1] = 0 if du is None else du


def conv_silu_vjp(conv: nn.Conv1d, pre: Tensor, g_c: Tensor, g_new: Tensor, g_window: Tensor) -> Tensor:
    """The reverse of a conv step and its window shift: cotangents g_c (r, …, C) on silu(pre) and g_new
    (r, …, C, K−1) on window'; writes the window's cotangent into ``g_window`` (r, …, C, K−1) and returns
    the new input's (r, …, C)."""
    w = conv.weight[:, 0, :]
    g_pre = g_c * silu_grad(pre)
    torch.mul(g_pre[..., None], w[:, :-1], out=g_window)
    g_window[..., 1:] += g_new[..., :-1]  # window' = (window[1:], u)
    return g_pre * w[:, -1] + g_new[..., -1]


def rms_vjp(x: Tensor, g: Tensor, eps: float) -> Tensor:
    """g · ∂rms(x)/∂x for rows g (…, n) broadcasting against x (the Jacobian is symmetric: the same
    formula as :func:`rms_jvp`'s tangent)."""
    return rms_jvp(x, g, eps)[1]


class TokenMap(nn.Module):
    """token ids → input vectors through the library's own embedding, times a fixed scale (or 1)."""

    def __init__(self, embedding: nn.Embedding, scale: Callable[[Tensor], Tensor] | None = None) -> None:
        super().__init__()
        self.embedding = embedding
        self.scale = scale
        self.num_embeddings = embedding.num_embeddings  # what the stability workflow reads as the vocabulary

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embedding(tokens)
        return x if self.scale is None else x * self.scale(x)


class Adapted(NamedTuple):
    """What an adapter module's ``adapt(model)`` returns: the core, the input map (token ids → vectors;
    None for a model that reads float vectors), the readout (None: the core's output), the library's
    own full-sequence forward (inputs → outputs, for the wrap-time check) and its tolerance."""

    core: LibraryCore
    inputs: nn.Module | None
    readout: nn.Module | None
    forward: Callable[[Tensor], Tensor]
    tolerance: float


def hf_forward(model: nn.Module) -> Callable[[Tensor], Tensor]:
    """A transformers model's own forward without a cache: token ids (B, T) → logits (a ``…ForCausalLM``)
    or the last hidden state (a bare ``…Model``)."""
    def run(tokens: Tensor) -> Tensor:
        out = model(input_ids=tokens, use_cache=False)
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out.last_hidden_state
    return run


# The wrap-time error model, measured (bench/wrap_agreement.py; docs/models-from-libraries.md): on
# random-init transformers Mamba models in float32 the adapter and the library's own forward differ by
# at most ERROR_COEF · eps · depth^1.5 relative to the logits' scale (the worst case, d_model 768,
# gives 11.7, 12.9 and 15.2 at 4, 12 and 24 layers; narrower models far less). Float64 models measure
# below the float32 bound: the libraries round to float32 in places even then, so eps is never below
# float32's. MARGIN covers seeds, widths and families not measured.
ERROR_COEF = 16.0
MARGIN = 3.0
HALF_CAP = 1e-2  # half precision is not measured: the eps-scaled bound would be vacuous there, so capped


def adapt_backbone(model: nn.Module, core: Callable[[nn.Module], LibraryCore], family: str,
                   tolerance: float) -> Adapted:
    """The adapter of a transformers ``…ForCausalLM``/``…Model`` whose backbone has ``layers``, ``norm_f``
    and ``embeddings`` (the Mamba families): ``core`` of the backbone, its embedding, the LM head if any."""
    backbone = getattr(model, "backbone", model)
    check(hasattr(backbone, "layers") and hasattr(backbone, "norm_f"),
          f"model: {type(model).__name__} has no {family} backbone (layers, norm_f)")
    return Adapted(core(backbone), TokenMap(backbone.embeddings), getattr(model, "lm_head", None),
                   hf_forward(model), tolerance)


def agreement_tolerance(depth: int, dtype: torch.dtype, floor: float = 0.0) -> float:
    """Relative tolerance of the wrap-time comparison with the library for a model of ``depth``
    layers whose weights are ``dtype``: MARGIN · ERROR_COEF · eps · depth^1.5 (eps: of ``dtype``, at
    least float32's), at least ``floor`` (the adapter's stated tolerance), at most 1e-2 unless the
    floor is higher. The one function every path (``gradscope.wrap``, ``--model hf``, factories) uses."""
    check(isinstance(depth, int) and depth >= 1, f"depth: got {depth!r}; expected a positive number of layers")
    eps = max(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps) if dtype.is_floating_point else \
        torch.finfo(torch.float32).eps
    return max(floor, min(HALF_CAP, MARGIN * ERROR_COEF * eps * depth ** 1.5))


def check_against_library(wrapped: Callable[[Tensor], Tensor], library_forward: Callable[[Tensor], Tensor], example: Tensor,
                          tolerance: float, what: str, basis: str = "") -> float:
    """Outputs of ``wrapped`` (the adapter's scan plus readout) against the library's own forward on
    ``example`` (token ids (B, T), or float inputs (B, T, in)); a difference above ``tolerance``
    relative to the outputs' largest magnitude (at least 1) refuses the model; ``basis`` says in the
    message where the tolerance came from. Returns the relative difference."""
    with torch.no_grad():  # the library first: a forward may change its weights (RWKV's eval-mode rescaling)
        theirs = library_forward(example)
        ours = wrapped(example)
    check(ours.shape == theirs.shape, f"model: the adapter gives outputs {tuple(ours.shape)}, the library "
                                      f"{tuple(theirs.shape)}; this {what} is not one the adapter knows")
    theirs = theirs.to(ours.dtype)
    finite = torch.isfinite(theirs)
    if not bool(finite.all()):  # a broken model's (NaN/Inf weights, named in a warning before): the same pattern
        check(same_nonfinite(ours, theirs), f"model: gradscope's {what} adapter and the library's own forward give NaN or Inf in different "
                    f"places on a small batch; this model is not the architecture the adapter knows")
        ours, theirs = ours[finite], theirs[finite]
        if theirs.numel() == 0:
            return float("nan")
    err = float((ours - theirs).abs().max())
    scale = max(1.0, float(theirs.abs().max()))
    if not err <= tolerance * scale:
        raise GradscopeError(f"model: gradscope's {what} adapter and the library's own forward disagree by "
                             f"{err:.2e} (> {tolerance:.3g} × {scale:.3g}{basis}) on a small batch; this model is not "
                             f"the architecture the adapter knows, so its Jacobians would be wrong")
    return err / scale


