"""The user's own recurrent model: :func:`wrap` turns a plain ``nn.RNN``/``nn.GRU``/``nn.LSTM``, or any
module that follows the core protocol (:mod:`gradscope.models.core`), into a model every gradscope
analysis takes.

An ``nn.RNN/GRU/LSTM`` is held as it is, inside the registered core of its type, so the analytic
engine runs on the module's own weights (no copy, no retraining). Its state is every layer's state,
layer 1 first; an LSTM layer holds [h, c], so a 2-layer LSTM's z is [h_1, c_1, h_2, c_2]. At wrap
time the module's fused forward and gradscope's functional cells are compared on a small random
batch; a disagreement above ``tolerance`` is an error, never a silently wrong Jacobian.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from gradscope.errors import GradscopeError, check
from gradscope.models.core import scan
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

    def core_inputs(self, tokens: Tensor) -> Tensor:
        """The vectors the core reads: token ids (B, T) through ``inputs``, or float inputs (B, T, in) as given."""
        if self.inputs is None:
            check(tokens.is_floating_point() and tokens.dim() == 3,
                  f"tokens: this wrapped model has no inputs map, so it reads float vectors (B, T, in); got "
                  f"{tokens.dtype} of shape {tuple(tokens.shape)} (pass inputs=nn.Embedding(...) to read token ids)")
            return tokens
        check(not tokens.is_floating_point() and tokens.dim() == 2,
              f"tokens: this wrapped model reads token ids (B, T); got {tokens.dtype} of shape {tuple(tokens.shape)}")
        return self.inputs(tokens)

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
    err = float((fused - functional).abs().max())
    scale = max(1.0, float(fused.abs().max()))
    if not err <= tolerance * scale:
        raise GradscopeError(f"rnn: its fused forward and gradscope's functional {core.name} cell disagree by "
                             f"{err:.2e} (> {tolerance:g}); the module is not a standard {type(core.rnn).__name__}, "
                             f"so its Jacobians would be wrong")


def wrap(rnn: nn.Module, inputs: Callable[[Tensor], Tensor] | None = None,
         readout: Callable[[Tensor], Tensor] | None = None, *, tolerance: float = 1e-5,
         seed: int = 0) -> WrappedModel:
    """A user's recurrent model, ready for :func:`gradscope.state_jacobian` and :func:`gradscope.stability`.

    rnn: an ``nn.RNN`` (tanh), ``nn.GRU`` or ``nn.LSTM`` (any number of layers, ``batch_first``
    either way, with or without bias, in eval mode or without dropout; not bidirectional, no
    ``proj_size``), or any module with ``step(x, z) → (y, z')``, ``state_dim`` and ``out_dim``.
    inputs: token ids (B, T) → the vectors the rnn reads (an ``nn.Embedding`` or any callable);
    None to feed float inputs (B, T, in) directly. readout: optional map of the outputs, e.g.
    an ``nn.Linear`` to logits. tolerance / seed: the fused-vs-functional check of an nn.RNN/GRU/LSTM.
    """
    if isinstance(rnn, nn.RNNBase):
        core: nn.Module = _rnn_core(rnn)
        _check_agreement(core, tolerance, seed)  # type: ignore[arg-type]
        source = f"torch.nn.{type(rnn).__name__}"
    elif isinstance(rnn, WrappedModel):
        raise GradscopeError("rnn: this model is already wrapped")
    else:
        missing = [name for name in PROTOCOL if not hasattr(rnn, name)]
        check(not missing, f"rnn: {type(rnn).__name__} is neither an nn.RNN/GRU/LSTM nor a core: it lacks "
                           f"{', '.join(missing)} (the protocol: step(x, z) -> (y, z'), state_dim, out_dim)")
        core, source = rnn, f"{type(rnn).__module__}.{type(rnn).__name__}"
    check(inputs is None or callable(inputs), f"inputs: got {type(inputs).__name__}; expected a callable such as nn.Embedding")
    check(readout is None or callable(readout), f"readout: got {type(readout).__name__}; expected a callable")
    return WrappedModel(core, inputs, readout, source)
