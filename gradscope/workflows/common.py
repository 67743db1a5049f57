"""What several workflows share: option checks,
checkpoint lists, the conditions to probe, the configs a store records, the diverged-model warning."""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from pathlib import Path
from typing import Any

from gradscope.config import RunConfig, TaskConfig
from gradscope.errors import check
from gradscope.files.checkpoint import Loaded, load_checkpoint, resolve_checkpoints
from gradscope.tasks.probes import GROUPS



class DivergedWarning(UserWarning):
    """Some Jacobians or values had NaN or Inf entries (a diverged model): counted, and said once."""


def warn_diverged(found: str, consequence: str) -> None:
    """A :class:`DivergedWarning`: ``found`` non-finite things (e.g. '3 of 64 Jacobians'), and what
    became of them."""
    warnings.warn(DivergedWarning(f"non-finite (NaN or Inf) values, a diverged model: {found}; {consequence}"),
                  stacklevel=3)


def conditions_for(task: TaskConfig, targets: tuple[str, ...], disturbants: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (target group, disturbant group) conditions to probe, checked against the vocabulary."""
    for name, groups in (("target_freq", targets), ("disturbant", disturbants)):
        for g in groups:
            check(g in GROUPS, f"{name}: got {g!r}; valid values are {', '.join(GROUPS)}")
    dual = task.distribution == "dual"
    if not dual:
        split = [g for g in targets + disturbants if g != "all"]
        check(not split, f"target_freq/disturbant: got {split[0] if split else ''!r}, but this checkpoint "
                         f"was trained on a uniform vocabulary, which has no frequent/rare split; use all")
    default = ("frequent", "rare") if dual else ("all",)
    return list(itertools.product(targets or default, disturbants or default))


def expand_checkpoints(sources: list[Path | Loaded]) -> list[Path | Loaded]:
    """Files and loaded checkpoints as given; run directories expanded to their checkpoints (oldest first)."""
    check(bool(sources), "checkpoint: give at least one checkpoint file or run directory")
    return [c for s in sources for c in ([s] if isinstance(s, Loaded) else resolve_checkpoints(Path(s)))]


def load_source(item: Path | Loaded) -> Loaded:
    """A checkpoint, loaded (and validated) from its file, or as it was already loaded: a workflow
    never reads a loaded checkpoint from disk again."""
    return item if isinstance(item, Loaded) else load_checkpoint(item)


def checkpoint_sources(source: Any) -> list[Path | Loaded]:
    """A workflow's ``source`` (a path, a Loaded, or a list of them) as a list; anything else is a user error."""
    items = [source] if isinstance(source, (str, Path, Loaded)) else list(source) \
        if isinstance(source, (list, tuple)) else [source]
    check(all(isinstance(i, (str, Path, Loaded)) for i in items),
          f"source: got {type(source).__name__}; expected checkpoint path(s), a Loaded checkpoint or a model")
    return [i if isinstance(i, Loaded) else Path(i) for i in items]


def config_attrs(config: RunConfig) -> dict[str, Any]:
    """The three config dicts a store records."""
    return {"model_config": dataclasses.asdict(config.model), "task_config": dataclasses.asdict(config.task),
            "train_config": dataclasses.asdict(config.train)}


def model_id(model_config: dict[str, Any]) -> str:
    """The identifier a stability store's ``model`` coordinate holds: '<core>-<pe>' for a gradscope
    model ('gru-sinusoidal'), the core's name for another model. Reports and tables show
    :func:`gradscope.store.inputs.model_label` ('GRU PE (sinusoidal)') instead."""
    core = model_config.get("core", "?")
    return f"{core}-{model_config['pe']}" if "pe" in model_config else str(core)
