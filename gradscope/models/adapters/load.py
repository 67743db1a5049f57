"""Library models from files, for ``--model-factory hf[:CLASS]`` (no network, no pickles from a
directory), loaded exactly or not at all.

- ``hf`` / ``hf:CLASS`` with a **directory** (what ``model.save_pretrained(dir)`` writes: ``config.json``
  plus ``model.safetensors``, or shards listed in ``model.safetensors.index.json``); CLASS defaults to
  the config's ``architectures[0]``; the model's dtype is the config's (else the weights'), as
  ``from_pretrained``'s ``dtype="auto"``, except that half precision is loaded as float32 (exactly).
- ``hf:CLASS`` with a **weights file** and ``config`` (a ``config.json``): ``.safetensors``, or a
  ``.pt``/``.pth``/``.bin`` state dict read with ``torch.load(weights_only=True)``.

Either way, gradscope loads the weights itself rather than through ``from_pretrained`` (which
initialises at random whatever the files lack):

1. the weights' names, dtypes and shapes come from the safetensors headers alone
   (:mod:`gradscope.models.adapters.weights`; a truncated or altered file is refused there);
2. the model is built from the config on the ``meta`` device (no memory), and its state — every
   persistent parameter and buffer, tied names as one — is compared with the weights: a missing,
   extra or mis-shaped tensor is a one-line error that names it;
3. the model's bytes are checked against :func:`gradscope.guard.memory_budget`;
4. only then is it built, and every tensor of its state copied from the files (tied weights once;
   non-persistent buffers, which no file holds, are what the model computes itself).

CLASS must be one gradscope has an adapter for (:data:`gradscope.models.adapters.ADAPTERS`). Every
failure of transformers or safetensors while loading is a :class:`GradscopeError`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradscope.errors import GradscopeError, check
from gradscope.guard import check_bytes, check_tensor
from gradscope.models.adapters import class_names
from gradscope.models.adapters.weights import TensorInfo, read_headers, read_json, safetensors_header, weight_files

PICKLES = (".pt", ".pth", ".bin")
LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_blocks")  # each layer has a tensor
AUTO_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


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


def _config(cls: Any, data: dict[str, Any], cfg_file: Path, label: str, tensors: dict[str, TensorInfo]) -> Any:
    """The config of ``data``; a layer count beyond the number of tensors is refused first (a config
    may build per-layer lists, and the model a module per layer, before anything else would)."""
    stack: list[Any] = [data]
    while stack:  # iterative: a config nests as deep as the JSON parser allowed
        item = stack.pop()
        if isinstance(item, float):
            check(math.isfinite(item), f"{label}: {cfg_file} holds {item}; a config's numbers must be finite")
        elif isinstance(item, dict) and set(item) == {"__float__"}:  # how save_pretrained writes ±Infinity
            check(item["__float__"] in ("Infinity", "-Infinity"),
                  f"{label}: {cfg_file} holds {item}; a config's numbers must be numbers or ±Infinity (a limit)")
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    for key in LAYER_KEYS:
        n = data.get(key)
        check(not isinstance(n, int) or n <= max(len(tensors), 1),
              f"{label}: {cfg_file} has {key} {n}, more than the {len(tensors)} tensors of the weights")
    try:
        decode = getattr(cls.config_class, "_decode_special_floats", None)  # ±Infinity back to floats
        return cls.config_class.from_dict(decode(data) if decode is not None else data)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types on a bad config: one line
        raise GradscopeError(f"{label}: {cfg_file} is not a valid {cls.config_class.__name__} ({_one_line(exc)})") from None


def _construct(cls: Any, cfg: Any, dtype: torch.dtype | None) -> nn.Module:
    return cls(cfg) if dtype is None else cls._from_config(cfg, dtype=dtype)


def _auto_dtype(data: dict[str, Any], tensors: dict[str, TensorInfo]) -> torch.dtype:
    """from_pretrained's ``dtype="auto"`` (the config's dtype, else the weights' first floating dtype,
    else float32), half precision raised to float32: the analyses (SVD, eigenvalues) have no half
    kernels, and every float16/bfloat16 value is exact in float32."""
    dtype = next((AUTO_DTYPES[data[key]] for key in ("dtype", "torch_dtype")
                  if isinstance(data.get(key), str) and data[key] in AUTO_DTYPES), None)
    if dtype is None:
        dtype = next((t.dtype for t in tensors.values() if t.dtype in AUTO_DTYPES.values()), torch.float32)
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _expected(model: nn.Module) -> tuple[dict[str, nn.Parameter | torch.Tensor], list[list[str]]]:
    """The model's state (persistent parameters and buffers, by name) and its groups of names that
    share one tensor (tied weights; a group of one otherwise)."""
    state = model.state_dict(keep_vars=True)
    groups: dict[int, list[str]] = {}
    for name, value in state.items():
        groups.setdefault(id(value), []).append(name)
    return state, list(groups.values())


def check_against(meta: nn.Module, tensors: dict[str, TensorInfo], where: Path, what: str) -> None:
    """The weights ``tensors`` against the state of ``meta`` (the model built on the meta device):
    every tensor it has is there (a tied group once), none it lacks, each of its shape and kind."""
    state, groups = _expected(meta)
    extra = [n for n in tensors if n not in state]
    check(not extra, f"checkpoint: {where} holds tensor {extra[:1][0] if extra else ''}, which a {what} does not have"
                     + (f" ({len(extra) - 1} more)" if len(extra) > 1 else "") + "; it is another model's or another config's")
    missing = [g[0] for g in groups if not any(n in tensors for n in g)]
    check(not missing, f"checkpoint: {where} lacks tensor {missing[:1][0] if missing else ''} of the {what}"
                       + (f" ({len(missing) - 1} more)" if len(missing) > 1 else "") + "; gradscope initialises nothing at random")
    for name, info in tensors.items():
        want = state[name]
        check(tuple(want.shape) == info.shape,
              f"checkpoint: {where}: tensor {name} has shape {info.shape}; the {what} has {tuple(want.shape)} "
              f"(config.json and the weights disagree)")
        ok = (info.dtype.is_floating_point and want.dtype.is_floating_point) or info.dtype == want.dtype
        check(ok, f"checkpoint: {where}: tensor {name} is {str(info.dtype).replace('torch.', '')}; the {what} "
                  f"holds {str(want.dtype).replace('torch.', '')}")


def _model_bytes(model: nn.Module) -> int:
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def _build(cls: Any, cfg: Any, name: str, cfg_file: Path, where: Path, stored: dict[str, TensorInfo],
           dtype: torch.dtype | None, extra_bytes: int = 0) -> tuple[nn.Module, Conversion]:
    """The model of ``cfg``, checked on the meta device against the ``stored`` tensors (as the library's
    conversion names them) and the memory budget, then built for real (its weights still to be filled in, through
    the returned conversion). Errors about the config name the ``config`` parameter only when it was one (a
    weights file's), else the checkpoint."""
    label = "checkpoint" if cfg_file.parent == where else "config"
    what = f"{name} of {cfg_file.name}"
    try:
        with torch.device("meta"):
            meta = _construct(cls, cfg, dtype)
    except Exception as exc:  # noqa: BLE001 - a config transformers cannot build: one line
        raise GradscopeError(f"{label}: {cfg_file} does not build a {name} ({_one_line(exc)})") from None
    conversion = Conversion(meta, where)
    check_against(meta, conversion.headers(stored), where, what)
    check_bytes(_model_bytes(meta) + extra_bytes, f"checkpoint: {where}: a {what}")
    try:
        return _construct(cls, cfg, dtype), conversion
    except Exception as exc:  # noqa: BLE001 - as above, now with memory
        raise GradscopeError(f"{label}: {cfg_file} does not build a {name} ({_one_line(exc)})") from None


def _fill(model: nn.Module, values: Any, where: Path) -> None:
    """Copy every (name, tensor) of ``values`` into the model's state; a tied group's names must agree."""
    state, groups = _expected(model)
    group_of = {n: i for i, g in enumerate(groups) for n in g}
    done: dict[int, str] = {}
    with torch.no_grad():
        for name, value in values:
            g = group_of[name]
            if g in done:
                check(torch.equal(state[name], value.to(state[name].dtype)),
                      f"checkpoint: {where}: tensors {done[g]} and {name} are one tied weight of the model but differ")
                continue
            state[name].copy_(value)
            done[g] = name


class Conversion:
    """transformers' own conversion from a checkpoint's names and layout to its model's (the list of
    ``WeightRenaming``/``WeightConverter`` that ``from_pretrained`` applies for the class: e.g. a MoE block's
    experts, saved one by one, stacked into ``experts.gate_up_proj``; Nemotron-H's ``backbone.`` prefix; Kimi
    Linear's original names), applied to the headers first (on the meta device: names and shapes only) and
    then to the values, each converted tensor as soon as all its sources have been read."""

    def __init__(self, meta: nn.Module, where: Path) -> None:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter

        transforms = get_model_conversion_mapping(meta)
        self.renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
        self.converters = [t for t in transforms if isinstance(t, WeightConverter)]
        self.by_pattern = {p: c for c in self.converters for p in c.source_patterns}
        self.meta, self.where = meta, where
        self.state = meta.state_dict()
        self.sources: dict[str, int] = {}  # a converted tensor → how many stored tensors make it

    def target(self, key: str) -> tuple[str, str | None]:
        """(the model's name for stored tensor ``key``, the converter's pattern that takes it, or None)."""
        from transformers.core_model_loading import rename_source_key

        name, pattern = rename_source_key(key, self.renamings, self.converters, self.meta.base_model_prefix,
                                          self.state)
        if name not in self.state and key in self.state:  # as from_pretrained: a name the model has stays
            return key, None
        return name, pattern

    def _convert(self, name: str, got: list[tuple[str, str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The converter's tensors for ``name`` from its (stored name, pattern, tensor) sources."""
        from copy import deepcopy

        from transformers.core_model_loading import dot_natural_key

        converter = deepcopy(self.by_pattern[got[0][1]])
        for key, pattern, value in sorted(got, key=lambda g: dot_natural_key(g[0])):  # experts 0, 1, …, 10
            converter.add_tensor(name, key, pattern, lambda v=value: v)
        try:
            return converter.convert(name, model=self.meta, config=self.meta.config)
        except Exception as exc:  # noqa: BLE001 - ragged or incomplete sources: one line
            raise GradscopeError(f"checkpoint: {self.where}: the tensors of {name} ({got[0][0]} …) do not convert "
                                 f"as transformers converts them ({_one_line(exc)})") from None

    def headers(self, stored: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
        """The stored headers as the model's names, shapes and dtypes (converted on the meta device)."""
        out: dict[str, TensorInfo] = {}
        groups: dict[str, list[tuple[str, str, torch.Tensor]]] = {}
        for key, info in stored.items():
            name, pattern = self.target(key)
            if pattern is None:
                out[name] = info
            else:
                groups.setdefault(name, []).append((key, pattern, torch.empty(info.shape, dtype=info.dtype,
                                                                             device="meta")))
        for name, got in groups.items():
            self.sources[name] = len(got)
            file = stored[got[0][0]].file
            for full, value in self._convert(name, got).items():
                out[full] = TensorInfo(value.dtype, tuple(value.shape), file)
        return out

    def values(self, items: Any):  # noqa: ANN201 - a generator of (name, tensor)
        """(the model's name, tensor) of the stored (name, tensor) ``items``, after :meth:`headers`."""
        pending: dict[str, list[tuple[str, str, torch.Tensor]]] = {}
        for key, value in items:
            name, pattern = self.target(key)
            if pattern is None:
                yield name, value
                continue
            got = pending.setdefault(name, [])
            got.append((key, pattern, value))
            if len(got) == self.sources.get(name, 0):
                yield from self._convert(name, pending.pop(name)).items()
        check(not pending, f"checkpoint: {self.where}: the tensors of {next(iter(pending), '')} changed while "
                           f"they were read")


def _safetensors_values(files: list[Path]):  # noqa: ANN202 - a generator of (name, tensor)
    try:
        from safetensors import safe_open
    except ImportError:
        raise GradscopeError("checkpoint: .safetensors needs safetensors: pip install 'gradscope[hf]'") from None
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    yield name, fh.get_tensor(name)
        except GradscopeError:
            raise
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise GradscopeError(f"checkpoint: {f} is not a readable safetensors file ({_one_line(exc)})") from None


def load_hf(spec: str, path: Path, config: Path | None = None) -> nn.Module:
    """A transformers model from ``path`` (a saved directory, or a weights file with ``config``), in eval
    mode, every persistent parameter and buffer from the weights (see the module's docstring)."""
    transformers = _transformers()
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its notes on a config it accepts: the checks here judge it
    try:
        return _load_hf(transformers, spec, Path(path), config)
    finally:
        transformers.logging.set_verbosity(verbosity)


def _load_hf(transformers: Any, spec: str, path: Path, config: Path | None) -> nn.Module:
    _, _, name = spec.partition(":")
    if path.is_dir():
        check(config is None, "config: a saved directory carries its own config.json; give --config only with a weights file")
        cfg_file = path / "config.json"
        check(cfg_file.is_file(), f"checkpoint: {path} has no config.json (expected what save_pretrained writes)")
        data = read_json(cfg_file, "checkpoint")
        if not name:
            archs = data.get("architectures")
            check(isinstance(archs, list) and bool(archs) and isinstance(archs[0], str),
                  f"checkpoint: {cfg_file} names no architectures; use --model-factory hf:CLASS")
            name = archs[0]
        cls = _class(transformers, name)
        files, weight_map = weight_files(path)
        stored = read_headers(files, weight_map)
        model, conversion = _build(cls, _config(cls, data, cfg_file, "checkpoint", stored), name, cfg_file, path, stored,
                                   _auto_dtype(data, stored))
        _fill(model, conversion.values(_safetensors_values(files)), path)
    else:
        check(bool(name), "model_factory: with a weights file give the class, e.g. --model-factory hf:MambaForCausalLM")
        check(config is not None, f"config: hf:{name} with a weights file needs --config config.json")
        cls = _class(transformers, name)
        cfg_file = Path(config)  # type: ignore[arg-type]
        data = read_json(cfg_file, "config")
        check(path.is_file(), f"checkpoint: {path} does not exist")
        if path.suffix == ".safetensors":
            stored = safetensors_header(path)
            cfg = _config(cls, data, cfg_file, "config", stored)
            model, conversion = _build(cls, cfg, name, cfg_file, path, stored, None)
            _fill(model, conversion.values(_safetensors_values([path])), path)
        else:
            check(path.suffix in PICKLES, f"checkpoint: {path} is neither .safetensors nor one of {', '.join(PICKLES)}")
            check_bytes(path.stat().st_size, f"checkpoint: {path}")
            state = read_weights(path)
            stored = {k: TensorInfo(v.dtype, tuple(v.shape), path) for k, v in state.items()}
            cfg = _config(cls, data, cfg_file, "config", stored)
            model, conversion = _build(cls, cfg, name, cfg_file, path, stored, None, extra_bytes=path.stat().st_size)
            _fill(model, conversion.values(state.items()), path)
    return model.eval()  # its NaN/Inf weights, if any, are named by gradscope.wrap


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from ``.safetensors``, or from a pickle with ``torch.load(weights_only=True)``."""
    path = Path(path)
    check(path.is_file(), f"checkpoint: {path} does not exist")
    if path.suffix == ".safetensors":
        safetensors_header(path)  # a truncated or altered file: refused before safetensors reads it
        return dict(_safetensors_values([path]))
    check(path.suffix in PICKLES, f"checkpoint: {path} is neither .safetensors nor one of {', '.join(PICKLES)}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - unpickling errors of many kinds
        raise GradscopeError(f"checkpoint: {path} does not load with torch.load(weights_only=True) "
                             f"({type(exc).__name__})") from None
    check(isinstance(state, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()),
          f"checkpoint: {path} is not a state dict of tensors")
    for k, v in state.items():
        check_tensor(v, f"checkpoint: {path}: tensor {k}")
    return state
