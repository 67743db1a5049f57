"""Library models as gradscope cores: ``gradscope.wrap(model)`` recognises these classes by name and
module (the libraries are optional extras, imported only by the adapter that needs them):

========================  ==========================================================  =================
library                   classes                                                     adapter module
========================  ==========================================================  =================
transformers              ``MambaForCausalLM``, ``MambaModel``, ``FalconMamba…``      ``hf_mamba``
transformers              ``RwkvForCausalLM``, ``RwkvModel``                          ``hf_rwkv``
transformers              ``xLSTMForCausalLM``, ``xLSTMModel`` (mLSTM)                ``hf_xlstm``
transformers              ``RecurrentGemmaForCausalLM``, ``RecurrentGemmaModel``       ``hf_recurrent_gemma``
mambapy                   ``Mamba``, ``LM``                                           ``mambapy``
========================  ==========================================================  =================

Each adapter module has ``adapt(model) → Adapted`` (:mod:`gradscope.models.adapters.base`).
:func:`wrap_library` builds the wrapped model, compares it with the library's own forward and runs the
protocol checks (:mod:`gradscope.models.protocol`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from gradscope.models.wrap import WrappedModel

ADAPTERS: dict[tuple[str, str], str] = {
    ("transformers", "MambaForCausalLM"): "hf_mamba",
    ("transformers", "MambaModel"): "hf_mamba",
    ("transformers", "FalconMambaForCausalLM"): "hf_mamba",
    ("transformers", "FalconMambaModel"): "hf_mamba",
    ("transformers", "RwkvForCausalLM"): "hf_rwkv",
    ("transformers", "RwkvModel"): "hf_rwkv",
    ("transformers", "xLSTMForCausalLM"): "hf_xlstm",
    ("transformers", "xLSTMModel"): "hf_xlstm",
    ("transformers", "RecurrentGemmaForCausalLM"): "hf_recurrent_gemma",
    ("transformers", "RecurrentGemmaModel"): "hf_recurrent_gemma",
    ("mambapy", "Mamba"): "mambapy",
    ("mambapy", "LM"): "mambapy",
}


def adapter_for(model: object) -> str | None:
    """The adapter module name for ``model``'s class (or a base class), else None."""
    for cls in type(model).__mro__:
        key = (cls.__module__.split(".")[0], cls.__name__)
        if key in ADAPTERS:
            return ADAPTERS[key]
    return None


def class_names(library: str) -> list[str]:
    """The class names an adapter exists for in ``library`` ("transformers" or "mambapy")."""
    return [name for lib, name in ADAPTERS if lib == library]


def wrap_library(model: nn.Module, inputs: nn.Module | None = None, readout: nn.Module | None = None, *,
                 tolerance: float | None = None, seed: int = 0, checks: bool = True) -> WrappedModel:
    """A library model → a gradscope model (its own modules, no copies), checked against the library.

    inputs / readout: only for a model without its own (mambapy's bare ``Mamba`` reads float vectors
    and has no head): token ids → vectors, and outputs → e.g. logits. tolerance: of the wrap-time
    comparison with the library's own forward, relative to the outputs' largest magnitude (default:
    the adapter's stated one). seed: of the small random check batch. checks: also run the protocol
    checks (batched = per-sample step; vjp = func engine).
    """
    from gradscope.errors import check
    from gradscope.models.adapters.base import check_against_library
    from gradscope.models.core import scan
    from gradscope.models.protocol import check_protocol
    from gradscope.models.wrap import WrappedModel

    name = adapter_for(model)
    if name is None:
        raise TypeError(f"no adapter for {type(model).__name__}")
    module = importlib.import_module(f"gradscope.models.adapters.{name}")
    adapted = module.adapt(model)
    core = adapted.core
    kind = type(model).__name__
    check(inputs is None or adapted.inputs is None,
          f"inputs: a {kind} brings its own (its embedding); pass none")
    check(readout is None or adapted.readout is None, f"readout: a {kind} brings its own (its head); pass none")
    source = f"{type(model).__module__.split('.')[0]}.{kind}"
    param = next(model.parameters())
    gen = torch.Generator().manual_seed(seed)
    what = f"{core.family} ({source})"
    if adapted.inputs is not None:
        wrapped = WrappedModel(core, adapted.inputs, adapted.readout, source)
        example = torch.randint(0, adapted.inputs.num_embeddings, (2, 6), generator=gen).to(param.device)
        wrapped.library_error = check_against_library(wrapped, adapted.forward, example, tolerance or adapted.tolerance,
                                                      what)
        with torch.no_grad():
            x = wrapped.core_inputs(example)
    else:  # float inputs: the core's outputs against the library's, then the user's maps around them
        x = torch.randn(2, 6, core.out_dim, generator=gen, dtype=torch.float64).to(param)
        error = check_against_library(lambda v: scan(core, v)[0], adapted.forward, x, tolerance or adapted.tolerance,
                                      what)
        wrapped = WrappedModel(core, inputs, readout, source)
        wrapped.library_error = error
    if checks:
        check_protocol(core, x, seed=seed)
    wrapped.protocol_checked = True
    return wrapped


__all__ = ["ADAPTERS", "adapter_for", "class_names", "wrap_library"]
