"""Library models from files, for ``--model-factory hf[:CLASS]`` (no network, no pickles).

- ``hf`` / ``hf:CLASS`` with a **directory** (what ``model.save_pretrained(dir)`` writes: ``config.json``
  plus ``*.safetensors``): ``CLASS.from_pretrained(dir, local_files_only=True, use_safetensors=True)``;
  CLASS defaults to the config's ``architectures[0]``.
- ``hf:CLASS`` with a **weights file** and ``config`` (a ``config.json``): the model built from the
  config, its weights from the file: ``.safetensors``, or a ``.pt``/``.pth``/``.bin`` state dict read
  with ``torch.load(weights_only=True)``. Keys missing from the file must be tied weights.

CLASS must be one gradscope has an adapter for (:data:`gradscope.models.adapters.ADAPTERS`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from gradscope.errors import GradscopeError, check
from gradscope.models.adapters import class_names

PICKLES = (".pt", ".pth", ".bin")


def _transformers():  # noqa: ANN202 - the module
    try:
        import transformers
    except ImportError:
        raise GradscopeError("model_factory: 'hf' needs transformers: pip install 'gradscope[hf]'") from None
    return transformers


def _class(transformers, name: str):  # noqa: ANN001, ANN202 - a model class
    known = class_names("transformers")
    check(name in known, f"model_factory: hf:{name} is not a model gradscope has an adapter for; "
                         f"known: {', '.join(known)}")
    return getattr(transformers, name)


def load_hf(spec: str, path: Path, config: Path | None = None) -> nn.Module:
    """A transformers model from ``path`` (a saved directory, or a weights file with ``config``), in eval mode."""
    _, _, name = spec.partition(":")
    path = Path(path)
    transformers = _transformers()
    if path.is_dir():
        check(config is None, "config: a saved directory carries its own config.json; give --config only with a weights file")
        cfg_file = path / "config.json"
        check(cfg_file.is_file(), f"checkpoint: {path} has no config.json (expected what save_pretrained writes)")
        check(any(path.glob("*.safetensors")), f"checkpoint: {path} has no .safetensors weights; gradscope loads "
                                                f"no pickled weights from a directory")
        if not name:
            archs = _read_json(cfg_file).get("architectures") or []
            check(bool(archs), f"checkpoint: {cfg_file} names no architectures; use --model-factory hf:CLASS")
            name = archs[0]
        cls = _class(transformers, name)
        try:
            model = cls.from_pretrained(path, local_files_only=True, use_safetensors=True)
        except (OSError, ValueError, RuntimeError) as exc:
            raise GradscopeError(f"checkpoint: {name}.from_pretrained({path}) failed: "
                                 f"{' '.join(str(exc).split())[:200]}") from None
        return model.eval()
    check(bool(name), "model_factory: with a weights file give the class, e.g. --model-factory hf:MambaForCausalLM")
    check(config is not None, f"config: hf:{name} with a weights file needs --config config.json")
    cls = _class(transformers, name)
    try:
        cfg = cls.config_class.from_dict(_read_json(Path(config)))
    except (TypeError, ValueError) as exc:
        raise GradscopeError(f"config: {config} is not a valid {cls.config_class.__name__}: "
                             f"{' '.join(str(exc).split())[:200]}") from None
    model = cls(cfg)
    state = read_weights(path)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(model, "_tied_weights_keys", None) or {}
    check(not unexpected, f"checkpoint: {path} has weights a {name} does not: {', '.join(unexpected[:5])}")
    untied = [k for k in missing if k not in tied]
    check(not untied, f"checkpoint: {path} lacks weights of the {name}: {', '.join(untied[:5])}")
    if missing:
        model.tie_weights()
    return model.eval()


def _read_json(path: Path) -> dict:
    check(path.is_file(), f"config: {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GradscopeError(f"config: {path} is not JSON ({type(exc).__name__})") from None
    check(isinstance(data, dict), f"config: {path} holds {type(data).__name__}; expected a JSON object")
    return data


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from ``.safetensors``, or from a pickle with ``torch.load(weights_only=True)``."""
    path = Path(path)
    check(path.is_file(), f"checkpoint: {path} does not exist")
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise GradscopeError("checkpoint: .safetensors needs safetensors: pip install 'gradscope[hf]'") from None
        try:
            return load_file(str(path))
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise GradscopeError(f"checkpoint: {path} is not a readable safetensors file ({type(exc).__name__})") from None
    check(path.suffix in PICKLES, f"checkpoint: {path} is neither .safetensors nor one of {', '.join(PICKLES)}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - unpickling errors of many kinds
        raise GradscopeError(f"checkpoint: {path} does not load with torch.load(weights_only=True) "
                             f"({type(exc).__name__})") from None
    check(isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values()),
          f"checkpoint: {path} is not a state dict of tensors")
    return state
