"""The validation layer for what a checkpoint brings in.

Everything a checkpoint file holds is checked here, before any model is built: types, shapes and
dtypes of every tensor (dense CPU tensors whose storage really holds them: no sparse, meta or
stride-0 bomb), token ids against the vocabulary, the weights' shapes against the config (read
from a model built without initialising its parameters: :func:`model_template`), and the model's
size against the memory this machine has. Code behind this layer — building the model, evaluation, analysis,
resuming — may assume valid data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch
from torch.nn import init
from torch.overrides import TorchFunctionMode

from gradscope.config import ModelConfig, RunConfig
from gradscope.errors import GradscopeError, check
from gradscope.guard import check_bytes, check_ids, check_tensor
from gradscope.models import SeqModel, core_class
from gradscope.models.pe import pe_numbers
from gradscope.tasks import Batch, HeldOut, Task, supports_grid
from gradscope.tasks.base import IGNORE

FLOAT_BYTES = 4  # models are built in float32


@dataclass(frozen=True)
class Checked:
    """A checkpoint that passed validation: its configs, the model's state_dict (every tensor of
    the shape the config implies), the held-out data (int64 ids within the vocabulary) and the
    number of iterations completed."""

    config: RunConfig
    state: dict[str, torch.Tensor]
    heldout: HeldOut
    iteration: int


def check_fits(cfg: RunConfig, task: Task) -> None:
    """The model must cover the task: same number of classes, PE table long enough."""
    check(cfg.model.vocab_size == task.num_classes,
          f"model vocab_size: got {cfg.model.vocab_size}; the task needs {task.num_classes} classes")
    check(cfg.model.max_len >= task.total_len,
          f"max_len: got {cfg.model.max_len}; the task's sequences are {task.total_len} steps long")


def _least_parameters(cfg: ModelConfig) -> int:
    """A lower bound on the parameter count of any core: embedding, logits, one H×H block per
    layer and a PE table. Checked first, so that sizes whose product overflows are never built."""
    table = pe_numbers(cfg.pe, cfg.embed_size, cfg.max_len)
    return (cfg.vocab_size + 1) * cfg.embed_size + cfg.vocab_size * cfg.hidden_size \
        + cfg.num_layers * cfg.hidden_size ** 2 + table


class _SkipInit(TorchFunctionMode):
    """Skip parameter initialisation: ``torch.nn.init``'s in-place initialisers (and the in-place
    random fills they use) return their tensor untouched. Parameters are then ``torch.empty``
    allocations that nothing writes: the operating system maps their pages only when written, so
    a model built this way costs next to no memory or time. (A model built on the ``meta`` device
    would cost nothing too, but initialising meta tensors runs torch's Python reference kernels,
    which import the compiler stack, torch._dynamo: about 1.3 s of every command's start-up.)"""

    SKIPPED: frozenset[Callable[..., Any]] = frozenset(
        [getattr(init, name) for name in dir(init) if name.endswith("_") and not name.startswith("_")]
        + [torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.zero_, torch.Tensor.fill_])

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in self.SKIPPED:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def model_template(cfg: ModelConfig, what: str, copies: int = 1, extra: int = 0) -> dict[str, torch.Tensor]:
    """The state_dict a model of ``cfg`` has, as meta tensors (shapes and dtypes, no memory), after
    checking that ``copies`` of the model plus ``extra`` bytes fit in memory. The model is built on
    the CPU with its initialisation skipped (:class:`_SkipInit`) and the random generators' states
    restored afterwards, so checking leaves no trace: no memory written, no random number drawn."""
    label = f"{what}: a {cfg.core} model with hidden size {cfg.hidden_size}, embedding {cfg.embed_size}, " \
            f"vocabulary {cfg.vocab_size}, {cfg.num_layers} layer(s)"
    check_bytes(copies * FLOAT_BYTES * _least_parameters(cfg) + extra, label)
    try:
        with torch.random.fork_rng(devices=[]), _SkipInit():
            state = SeqModel(cfg).state_dict()
    except (MemoryError, RuntimeError) as exc:  # an address space too small for the (untouched) weights
        raise GradscopeError(f"{label}: cannot be built in this machine's memory ({str(exc).splitlines()[0][:80]})") \
            from None
    template = {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in state.items()}
    del state
    check_bytes(copies * tensor_bytes(template.values()) + extra, label)
    return template


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _names(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def check_state_dict(state: Any, template: Mapping[str, torch.Tensor], what: str) -> dict[str, torch.Tensor]:
    """``state`` as a model state_dict with exactly the template's names, each a dense floating
    point tensor of the template's shape."""
    check(isinstance(state, Mapping), f"{what}: the model weights are a {type(state).__name__}; expected a state_dict")
    check(all(isinstance(k, str) for k in state), f"{what}: the model weights have names that are not strings")
    missing, unexpected = set(template) - set(state), set(state) - set(template)
    if missing or unexpected:
        parts = ([f"missing {_names(missing)}"] if missing else []) + \
                ([f"unexpected {_names(unexpected)}"] if unexpected else [])
        raise GradscopeError(f"{what}: the weights do not fit the model its config describes ({'; '.join(parts)})")
    for key, value in state.items():
        check_tensor(value, f"{what}: weight {key}", kind="float", shape=tuple(template[key].shape))
    return dict(state)


def check_targets(targets: torch.Tensor, what: str, classes: int) -> None:
    """Targets are class ids in [0, classes) or IGNORE (unscored)."""
    bad = (targets != IGNORE) & ((targets < 0) | (targets >= classes))
    if bool(bad.any()):
        raise GradscopeError(f"{what}: held-out targets hold {int(targets[bad][0])}, outside the classes "
                             f"0..{classes - 1} (and {IGNORE} for unscored positions)")


def check_heldout(inputs: Any, targets: Any, grid: Any, task: Task, what: str, rows: int | None = None,
                  grid_rows: int | None = None) -> HeldOut:
    """The held-out data of a run on ``task``: inputs and targets (n, T) with ids of the task (the
    query token included), and an optional raw frequency grid (2, 2, N, L, L) of vocabulary tokens
    (dual-frequency reverse only). ``rows``/``grid_rows``: the n and N the config declares."""
    T, K = task.total_len, task.num_classes
    if task.inputs == "vectors":
        return _vector_heldout(inputs, targets, grid, task, what, rows)
    x = check_tensor(inputs, f"{what}: held-out inputs", kind="int", shape=(rows, T))
    y = check_tensor(targets, f"{what}: held-out targets", kind="int", shape=(x.shape[0], T))
    check_ids(x, f"{what}: held-out inputs", K + 1)  # id K is the query token
    check_targets(y, what, K)
    if grid is not None:
        check(supports_grid(task), f"{what}: holds a frequency grid, but its task ({task.cfg.name}, "
                                   f"{task.cfg.distribution}) has none")
        L = task.cfg.length
        g = check_tensor(grid, f"{what}: held-out grid", kind="int", shape=(2, 2, grid_rows, L, L))
        check_ids(g, f"{what}: held-out grid", task.cfg.vocab_size)
        grid = g.long()
    return HeldOut(Batch(x.long(), y.long()), grid)


def _vector_heldout(inputs: Any, targets: Any, grid: Any, task: Task, what: str, rows: int | None) -> HeldOut:
    """The held-out data of a vector task: inputs (n, T, d + 1) and targets (n, T, d), finite except
    the targets of unscored positions, which are NaN in every coordinate; no grid."""
    T, d = task.total_len, task.num_classes
    x = check_tensor(inputs, f"{what}: held-out inputs", kind="float", shape=(rows, T, d + 1))
    y = check_tensor(targets, f"{what}: held-out targets", kind="float", shape=(x.shape[0], T, d))
    check(grid is None, f"{what}: holds a frequency grid, but its task ({task.cfg.name}) has one frequency class")
    check(bool(x.isfinite().all()), f"{what}: held-out inputs hold NaN or infinite values")
    unscored = y.isnan()
    check(bool((unscored.all(-1) | ~unscored.any(-1)).all()) and bool(y[~unscored].isfinite().all()),
          f"{what}: held-out targets must be finite vectors, or NaN in every coordinate where unscored")
    return HeldOut(Batch(x.float(), y.float()), None)


def check_training_memory(cfg: RunConfig, task: Task, device: torch.device, what: str = "train") -> None:
    """Refuse a run whose model, optimizer state, batch activations or held-out data would not fit:
    the model is built in host memory; on a GPU the rest is compared with its free memory."""
    m, t = cfg.model, cfg.train
    grid = 4 * cfg.task.grid_per_cell * cfg.task.length * (cfg.task.length + 2 * task.total_len) \
        if supports_grid(task) else 0
    heldout = 8 * (2 * cfg.task.heldout_size * task.total_len + grid)  # int64 rows, inputs and targets
    # per token: the core's input, a few H-wide activations per layer, logits and their gradients
    own = core_class(m.core).token_floats(m.hidden_size, m.core_config)  # e.g. a selective scan's E × N state
    batch = FLOAT_BYTES * t.batch_size * task.total_len * (m.core_input_size + (8 * m.hidden_size + own) * m.num_layers
                                                           + 3 * m.vocab_size)
    template = model_template(m, what, copies=1, extra=heldout)
    params = tensor_bytes(template.values())
    label = f"{what}: training batch {t.batch_size} × {task.total_len} steps of a model with hidden size " \
            f"{m.hidden_size} and vocabulary {m.vocab_size}" + (f" (and {own:,} floats of the {m.core} core's own "
                                                                f"state per token and layer)" if own else "")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if 4 * params + batch > free:
            raise GradscopeError(f"{label}: needs about {(4 * params + batch) / 1e9:.1f} GB on {device}; "
                                 f"{free / 1e9:.1f} GB is free")
        check_bytes(params + heldout, label)
    else:
        check_bytes(4 * params + batch + heldout, label)  # weights, gradients, two Adam moments

