"""The user's own recurrent model: :func:`wrap` turns a plain ``nn.RNN``/``nn.GRU``/``nn.LSTM``, a model
from a library gradscope has an adapter for (transformers' Mamba, Falcon-Mamba, Mamba-2, RWKV, xLSTM,
RecurrentGemma; mambapy's Mamba: :mod:`gradscope.models.adapters`), or any module that follows the
core protocol (:mod:`gradscope.models.core`), into a model every gradscope analysis takes.

A protocol core is checked before its first Jacobian (:mod:`gradscope.models.protocol`: batched step =
per-sample step, vjp engine = func engine, torch.func can transform it): at wrap time when gradscope can
tell its input width (an ``in_dim`` attribute, or an ``inputs`` map), else on the first batch an
analysis feeds it.

An ``nn.RNN/GRU/LSTM`` is held as it is, inside the registered core of its type, so the analytic
engine runs on the module's own weights (no copy, no retraining). Its state is every layer's state,
layer 1 first; an LSTM layer holds [h, c], so a 2-layer LSTM's z is [h_1, c_1, h_2, c_2]. At wrap
time the module's fused forward and gradscope's functional cells are compared on a small random
batch; a disagreement above ``tolerance`` is an error, never a silently wrong Jacobian.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

import torch
from torch import Tensor, nn

from gradscope.errors import GradscopeError, check
from gradscope.guard import same_nonfinite, warn_nonfinite
from gradscope.models.adapters import adapter_for
from gradscope.models.adapters.base import agreement_tolerance, check_against_library
from gradscope.models.core import scan
from gradscope.models.protocol import check_protocol
from gradscope.models.registry import CORES
from gradscope.models.rnn import RNNCore

PROTOCOL = ("step", "state_dim", "out_dim")


class WrappedModel(nn.Module):
    """A user's core plus how inputs reach it (``inputs``: token ids (B, T) → vectors (B, T, in), or
    None for float inputs) and an optional ``readout`` from the core's outputs (e.g. to logits)."""

    query_token = None  # no output-phase query token of its own: probes say what the output phase holds

    def __init__(self, core: nn.Module, inputs: Callable[[Tensor], Tensor] | None = None,
                 readout: Callable[[Tensor], Tensor] | None = None, source: str = "") -> None:
        super().__init__()
        self.core = core
        self.inputs = inputs
        self.readout = readout
        self.source = source
        self.protocol_checked = True  # wrap() sets False for a protocol core it could not check yet
        self.check_seed = 0

    def core_inputs(self, tokens: Tensor) -> Tensor:
        """The vectors the core reads: token ids (B, T) through ``inputs``, or float inputs (B, T, in) as given."""
        if self.inputs is None:
            check(tokens.is_floating_point() and tokens.dim() == 3,
                  f"tokens: this wrapped model has no inputs map, so it reads float vectors (B, T, in); got "
                  f"{tokens.dtype} of shape {tuple(tokens.shape)} (pass inputs=nn.Embedding(...) to read token ids)")
            self._check_once(tokens)
            return tokens
        check(not tokens.is_floating_point() and tokens.dim() == 2,
              f"tokens: this wrapped model reads token ids (B, T); got {tokens.dtype} of shape {tuple(tokens.shape)}")
        x = self.inputs(tokens)
        self._check_once(x)
        return x

    def _check_once(self, x: Tensor) -> None:
        """The protocol checks on the first batch of core inputs an analysis sees (when wrap could not run them)."""
        if self.protocol_checked or x.shape[0] < 1 or x.shape[1] < 1:
            return
        check_protocol(self.core, x[:3, :4].detach(), seed=self.check_seed)
        self.protocol_checked = True

    def forward(self, tokens: Tensor) -> Tensor:
        """The fused path where the core has one (an nn.RNN/GRU/LSTM), else the functional scan;
        then the readout, if any. (B, T[, in]) → (B, T, out)."""
        x = self.core_inputs(tokens)
        y = self.core(x) if isinstance(self.core, RNNCore) else scan(self.core, x)[0]
        return self.readout(y) if self.readout is not None else y

    def describe(self) -> dict[str, Any]:
        """What a store records as this model's configuration."""
        core = self.core
        return {"core": getattr(core, "name", type(core).__name__), "wrapped": self.source,
                "hidden_size": int(core.out_dim), "state_dim": int(core.state_dim),
                "num_layers": int(getattr(core, "num_layers", 1)),
                "inputs": type(self.inputs).__name__ if self.inputs is not None else "float vectors",
                "readout": type(self.readout).__name__ if self.readout is not None else None}


def _rnn_core(module: nn.RNNBase) -> RNNCore:
    by_module = {cls.fused: cls for cls in CORES.values() if isinstance(cls, type) and issubclass(cls, RNNCore)}
    cls = by_module.get(type(module)) or next((c for t, c in by_module.items() if isinstance(module, t)), None)
    check(cls is not None, f"rnn: {type(module).__name__} is not one of {', '.join(t.__name__ for t in by_module)}")
    name = type(module).__name__
    check(not module.bidirectional, f"rnn: the {name} is bidirectional; gradscope analyses causal recurrences "
                                    f"only (wrap each direction's layers as separate unidirectional modules)")
    check(getattr(module, "proj_size", 0) == 0,
          f"rnn: the {name} has proj_size={module.proj_size}; LSTMs with projections are not supported")
    nonlinearity = getattr(module, "nonlinearity", "tanh")
    check(nonlinearity == "tanh", f"rnn: the {name} uses nonlinearity={nonlinearity!r}; gradscope's Elman core is tanh")
    check(not (module.training and module.dropout > 0 and module.num_layers > 1),
          f"rnn: the {name} is in train mode with dropout={module.dropout}; call .eval() first (dropout "
          f"makes the Jacobian random)")
    return cls(module.input_size, module.hidden_size, module.num_layers, module=module)


def _check_agreement(core: RNNCore, tolerance: float, seed: int) -> None:
    """Fused forward and functional scan on a small random batch must agree (relative to the outputs' scale)."""
    param = next(core.parameters())
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(3, 6, core.rnn.input_size, generator=gen, dtype=torch.float64).to(param)
    with torch.no_grad():
        fused = core(x)
        functional, _ = scan(core, x)
    finite = torch.isfinite(fused)
    if not bool(finite.all()):  # NaN/Inf weights (named in a warning before): the same places, the finite rest compared
        check(same_nonfinite(fused, functional),
              f"rnn: its fused forward and gradscope's functional {core.name} cell give NaN or Inf in different "
              f"places; the module is not a standard {type(core.rnn).__name__}")
        fused, functional = fused[finite], functional[finite]
        if fused.numel() == 0:
            return
    err = float((fused - functional).abs().max())
    scale = max(1.0, float(fused.abs().max()))
    if not err <= tolerance * scale:
        raise GradscopeError(f"rnn: its fused forward and gradscope's functional {core.name} cell disagree by "
                             f"{err:.2e} (> {tolerance:g}); the module is not a standard {type(core.rnn).__name__}, "
                             f"so its Jacobians would be wrong")


def _input_width(core: nn.Module, inputs: Callable[[Tensor], Tensor] | None) -> tuple[int, int | None] | None:
    """(input width, vocabulary or None) of a protocol core when gradscope can tell, else None."""
    vocab = getattr(inputs, "num_embeddings", None)
    if inputs is not None and vocab is not None:
        return int(getattr(inputs, "embedding_dim", 0)), int(vocab)
    if inputs is None:
        for name in ("in_dim", "input_size", "input_dim"):
            width = getattr(core, name, None)
            if isinstance(width, int) and width >= 1:
                return width, None
    return None


def _check_now(model: WrappedModel, seed: int) -> None:
    """The protocol checks at wrap time where the input width is known; else marked for the first analysis."""
    known = _input_width(model.core, model.inputs)
    model.check_seed = seed
    if known is None:
        model.protocol_checked = False
        return
    width, vocab = known
    param = next(model.core.parameters(), None)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if vocab is not None:
            tokens = torch.randint(0, vocab, (3, 4), generator=gen)
            x = model.inputs(tokens.to(param.device) if param is not None else tokens)
        else:
            x = torch.randn(3, 4, width, generator=gen, dtype=torch.float64)
            x = x.to(param) if param is not None and param.is_floating_point() else x.float()
    check_protocol(model.core, x, seed=seed)


def wrap_library(model: nn.Module, inputs: nn.Module | None = None, readout: nn.Module | None = None, *,
                 tolerance: float | None = None, seed: int = 0, checks: bool = True,
                 positions: int | None = None) -> WrappedModel:
    """A library model → a gradscope model (its own modules, no copies), checked against the library.

    inputs / readout: only for a model without its own (mambapy's bare ``Mamba`` reads float vectors
    and has no head): token ids → vectors, and outputs → e.g. logits. tolerance: of the wrap-time
    comparison with the library's own forward, relative to the outputs' largest magnitude (default:
    :func:`~gradscope.models.adapters.base.agreement_tolerance` of the model's depth and dtype, from a
    measured float32 error model, never below the adapter's stated one). The wrapped model records
    ``library_error`` (the measured difference) and ``library_tolerance``. seed: of the small random
    check batch. checks: also run the protocol checks (batched = per-sample step; vjp = func engine).
    positions: a model with attention layers: its attention caches' slots, the longest sequence it will
    read (default :data:`~gradscope.models.adapters.attention.POSITIONS`); refused for a model without.
    """
    name = adapter_for(model)
    if name is None:
        raise TypeError(f"no adapter for {type(model).__name__}")
    module = importlib.import_module(f"gradscope.models.adapters.{name}")
    if positions is None:
        adapted = module.adapt(model)
    else:
        check("positions" in inspect.signature(module.adapt).parameters,
              f"positions: a {type(model).__name__} has no attention layers, so no attention cache to size")
        adapted = module.adapt(model, positions=positions)
    core = adapted.core
    kind = type(model).__name__
    check(inputs is None or adapted.inputs is None,
          f"inputs: a {kind} brings its own (its embedding); pass none")
    check(readout is None or adapted.readout is None, f"readout: a {kind} brings its own (its head); pass none")
    source = f"{type(model).__module__.split('.')[0]}.{kind}"
    param = next(model.parameters())
    gen = torch.Generator().manual_seed(seed)
    what = f"{core.family} ({source})"
    depth = int(getattr(core, "num_layers", 1))
    if tolerance is None:  # the measured error model (adapters.base.agreement_tolerance), the same on every path
        tolerance = agreement_tolerance(depth, param.dtype, adapted.tolerance)
        basis = f": the tolerance of a {depth}-layer {str(param.dtype).removeprefix('torch.')} model"
    else:
        basis = ": the tolerance given"
    if adapted.inputs is not None:
        wrapped = WrappedModel(core, adapted.inputs, adapted.readout, source)
        length = min(6, int(getattr(core, "positions", 6)))  # an attention cache of fewer slots reads fewer tokens
        example = torch.randint(0, adapted.inputs.num_embeddings, (2, length), generator=gen).to(param.device)
        wrapped.library_error = check_against_library(wrapped, adapted.forward, example, tolerance, what, basis)
        with torch.no_grad():
            x = wrapped.core_inputs(example)
    else:  # float inputs: the core's outputs against the library's, then the user's maps around them
        x = torch.randn(2, 6, core.out_dim, generator=gen, dtype=torch.float64).to(param)
        error = check_against_library(lambda v: scan(core, v)[0], adapted.forward, x, tolerance, what, basis)
        wrapped = WrappedModel(core, inputs, readout, source)
        wrapped.library_error = error
    wrapped.library_tolerance = tolerance
    if checks:
        check_protocol(core, x, seed=seed)
    wrapped.protocol_checked = True
    return wrapped


def fit_positions(model: nn.Module, length: int) -> nn.Module:
    """``model`` with its attention caches sized to sequences of ``length`` tokens: for a library model with
    attention layers (its core has ``positions``), a wrapped model sharing every module whose core holds
    exactly ``length`` slots, so no analysis carries empty slots or overruns them; any other model as it is.
    The analyses that know their sequences' length call it (stability, dynamics, the text workflows)."""
    core = getattr(model, "core", None)
    positions = getattr(core, "positions", None)
    if positions is None or positions == length or not hasattr(core, "with_positions"):
        return model
    check(isinstance(length, int) and length >= 1, f"length: got {length!r}; expected a positive number of tokens")
    fitted = WrappedModel(core.with_positions(length), model.inputs, model.readout, model.source)
    for name in ("library_error", "library_tolerance", "protocol_checked", "check_seed"):
        if hasattr(model, name):
            setattr(fitted, name, getattr(model, name))
    return fitted.train(model.training)


def wrap(rnn: nn.Module, inputs: Callable[[Tensor], Tensor] | None = None,
         readout: Callable[[Tensor], Tensor] | None = None, *, tolerance: float | None = None,
         seed: int = 0, checks: bool = True, positions: int | None = None) -> WrappedModel:
    """A user's recurrent model, ready for :func:`gradscope.state_jacobian` and :func:`gradscope.stability`.

    rnn: an ``nn.RNN`` (tanh), ``nn.GRU`` or ``nn.LSTM`` (any number of layers, ``batch_first``
    either way, with or without bias, in eval mode or without dropout; not bidirectional, no
    ``proj_size``); a library model with an adapter (transformers ``MambaForCausalLM``/``MambaModel``,
    Falcon-Mamba, ``Mamba2ForCausalLM``, ``RwkvForCausalLM``, ``xLSTMForCausalLM``, ``RecurrentGemmaForCausalLM`` with
    recurrent blocks only, mambapy ``Mamba``/``LM``: they bring their own inputs and readout, except a
    bare mambapy ``Mamba``, which reads float vectors unless given ``inputs``); or any
    module with ``step(x, z) → (y, z')``, ``state_dim`` and ``out_dim``.
    inputs: token ids (B, T) → the vectors the rnn reads (an ``nn.Embedding`` or any callable);
    None to feed float inputs (B, T, in) directly. readout: optional map of the outputs, e.g.
    an ``nn.Linear`` to logits. tolerance: of the wrap-time comparison with the module's own forward
    (nn.RNN/GRU/LSTM: 1e-5; library models: scaled with depth and dtype, :func:`wrap_library`).
    seed: of the check batches.
    checks: run the protocol checks (:mod:`gradscope.models.protocol`) on a protocol core or adapter.
    positions: a library model with attention layers (Qwen3-Next): the slots of its attention caches, the
    longest sequence an analysis may feed it (:mod:`gradscope.models.adapters.attention`).
    """
    check(positions is None or adapter_for(rnn) is not None,
          f"positions: only a library model with attention layers has an attention cache to size; got {type(rnn).__name__}")
    warn_nonfinite(rnn, f"model: {type(rnn).__name__}")  # NaN/Inf weights named before any work
    half = next(((n, t.dtype) for n, t in rnn.state_dict().items() if t.dtype in (torch.float16, torch.bfloat16)), None)
    check(half is None, f"model: {type(rnn).__name__} holds {str(half[1]).replace('torch.', '')} tensors ({half[0]}, …); "
                        "gradscope's analyses (SVD, eigenvalues) need float32 or float64: wrap model.float() "
                        "(every half-precision value is exact in float32)" if half else "")
    if isinstance(rnn, nn.RNNBase):
        core: nn.Module = _rnn_core(rnn)
        _check_agreement(core, 1e-5 if tolerance is None else tolerance, seed)  # type: ignore[arg-type]
        source = f"torch.nn.{type(rnn).__name__}"
    elif isinstance(rnn, WrappedModel):
        raise GradscopeError("rnn: this model is already wrapped")
    elif adapter_for(rnn) is not None:
        return wrap_library(rnn, inputs, readout, tolerance=tolerance, seed=seed, checks=checks, positions=positions)
    else:
        missing = [name for name in PROTOCOL if not hasattr(rnn, name)]
        check(not missing, f"rnn: {type(rnn).__name__} is neither an nn.RNN/GRU/LSTM nor a core: it lacks "
                           f"{', '.join(missing)} (the protocol: step(x, z) -> (y, z'), state_dim, out_dim)")
        core, source = rnn, f"{type(rnn).__module__}.{type(rnn).__name__}"
    check(inputs is None or callable(inputs), f"inputs: got {type(inputs).__name__}; expected a callable such as nn.Embedding")
    check(readout is None or callable(readout), f"readout: got {type(readout).__name__}; expected a callable")
    model = WrappedModel(core, inputs, readout, source)
    if checks and not isinstance(core, RNNCore):
        _check_now(model, seed)
    return model
