"""``--model-factory``: the user's own code that builds their model from a checkpoint, or a library model.

- ``FILE.py:FUNC`` or ``package.module:FUNC``: ``FUNC(checkpoint_path)`` returns ``gradscope.wrap(...)``
  (or a plain nn.RNN/GRU/LSTM, or a library model gradscope has an adapter for, which is wrapped);
- ``hf`` / ``hf:CLASS``: a transformers model from a saved directory, or from a weights file plus
  ``--config`` (:mod:`gradscope.models.adapters.load`: safetensors, or ``torch.load(weights_only=True)``;
  ``local_files_only``, so no network).

Trust boundary: the factory file is Python the user chose to run, with the user's rights, like any
script of theirs; gradscope imports it and calls ``FUNC(checkpoint_path)``. Only the factory runs
code: gradscope never unpickles a checkpoint itself beyond ``torch.load(weights_only=True)``, and
the factory should load its state dict the same way (see the README).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Callable

from torch import nn

from gradscope.errors import GradscopeError, check
from gradscope.models.adapters import adapter_for
from gradscope.models.adapters.load import load_hf
from gradscope.models.wrap import WrappedModel, wrap


def load_factory(spec: str) -> Callable[[Path], nn.Module]:
    """``path/to/file.py:build`` (or an importable ``package.module:build``) → the function ``build``."""
    file, sep, name = str(spec).rpartition(":")
    check(bool(sep) and bool(file) and name.isidentifier(),
          f"model_factory: got {spec!r}; expected FILE.py:FUNCTION, package.module:FUNCTION or hf[:CLASS], "
          f"e.g. my_model.py:build")
    if not file.endswith(".py") and all(part.isidentifier() for part in file.split(".")):
        try:
            module = importlib.import_module(file)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module failed to import: one line
            raise GradscopeError(f"model_factory: importing {file} failed ({type(exc).__name__}: "
                                 f"{' '.join(str(exc).split())[:200]})") from None
        func = getattr(module, name, None)
        check(callable(func), f"model_factory: module {file} defines no function {name!r}")
        return func  # type: ignore[return-value]
    path = Path(file)
    check(path.is_file() and path.suffix == ".py", f"model_factory: {path} is not a Python file")
    module_name = f"gradscope_user_factory_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    check(loader_spec is not None and loader_spec.loader is not None, f"model_factory: cannot import {path}")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)  # type: ignore[union-attr]
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code failed; say where, in one line
        sys.modules.pop(module_name, None)
        raise GradscopeError(f"model_factory: importing {path} failed ({type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:200]})") from None
    func = getattr(module, name, None)
    check(callable(func), f"model_factory: {path} defines no function {name!r}")
    return func  # type: ignore[return-value]


def build_model(spec: str, checkpoint: Path, config: Path | None = None) -> WrappedModel:
    """Call the factory on ``checkpoint``; a plain nn.RNN/GRU/LSTM it returns is wrapped (float inputs), a
    library model through its adapter. ``hf[:CLASS]`` loads a transformers model (``config``: its
    config.json when ``checkpoint`` is a weights file)."""
    check(Path(checkpoint).exists(), f"checkpoint: {checkpoint} does not exist")
    if spec == "hf" or str(spec).startswith("hf:"):
        return wrap(load_hf(spec, Path(checkpoint), config))
    check(config is None, "config: --config goes with --model-factory hf:CLASS and a weights file")
    func = load_factory(spec)
    try:
        model = func(Path(checkpoint))
    except GradscopeError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code failed; say where, in one line
        raise GradscopeError(f"model_factory: {spec}({checkpoint}) raised {type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:200]}") from None
    if isinstance(model, WrappedModel):
        return model.eval()
    if isinstance(model, nn.RNNBase):
        return wrap(model.eval())
    if isinstance(model, nn.Module) and adapter_for(model) is not None:
        return wrap(model.eval())
    raise GradscopeError(f"model_factory: {spec} returned {type(model).__name__}; it must return "
                         f"gradscope.wrap(...) (or a plain nn.RNN/GRU/LSTM, or a library model gradscope adapts)")
