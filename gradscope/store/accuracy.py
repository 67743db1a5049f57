"""The accuracy store: held-out evaluation over checkpoints (layout in docs/stores.md)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import xarray as xr

from gradscope.analysis.accuracy import bin_edges
from gradscope.config import RunConfig
from gradscope.files.io import sha256_file
from gradscope.store.io import attr_json, provenance
from gradscope.tasks import GROUP_NAMES, TASKS, Task
from gradscope.tasks.registry import family_of
from gradscope.tasks.family import Panel, ReportSection, ratio as _ratio  # noqa: F401 (Panel: for reports)
from gradscope.store.records import AccuracyResult, FamilyResult

ITEM_NAMES = ("old", "new")  # an extended vocabulary's pretrained items and the items added to it


def accuracy_dataset(results: list[AccuracyResult], config: RunConfig | dict[str, dict[str, Any]],
                     options: dict[str, Any], command: str, device: str) -> xr.Dataset:
    """Dims: checkpoint, sequence, time, target_group, disturbant_group, target_position, bin; and
    those of the task family's own part (its ``layout``).
    ``config``: the run's, or the three config dicts (model_config, task_config, train_config) of a
    model gradscope did not train. ``options``: ``bins`` (a count or a list of edges) and ``grid``
    (token tasks), recorded as given."""
    first = results[0]
    stack = lambda name: np.stack([getattr(r, name) for r in results])  # noqa: E731
    scored_times = np.flatnonzero(first.time_scored > 0)
    data: dict[str, Any] = {
        "token_accuracy": ("checkpoint", np.array([r.token_accuracy for r in results])),
        "sequence_accuracy": ("checkpoint", np.array([r.sequence_accuracy for r in results])),
        "dl_distance": ("checkpoint", np.array([r.dl_distance for r in results])),
        "position_accuracy": (("checkpoint", "time"),
                              _ratio(stack("time_correct"), stack("time_scored"))[:, scored_times]),
        "sequence_correct": (("checkpoint", "sequence"), stack("sequence_correct")),
        "sequence_scored": ("sequence", first.sequence_scored),
        "sequence_dl": (("checkpoint", "sequence"), stack("sequence_dl")),
    }
    coords: dict[str, Any] = {
        "checkpoint": np.arange(len(results)),
        "iteration": ("checkpoint", np.array([r.iteration for r in results])),
        "checkpoint_path": ("checkpoint", np.asarray([str(r.path) for r in results], dtype=object)),
        "run": ("checkpoint", np.asarray([r.run for r in results], dtype=object)),
        "sequence": np.arange(first.sequence_scored.size),
        "time": scored_times + 1,
    }
    if first.grid_correct is not None:
        groups = np.asarray(GROUP_NAMES, dtype=object)
        grid_dims = ("checkpoint", "target_group", "disturbant_group")
        edges = bin_edges(first.grid_correct.shape[-1], options["bins"])
        data["grid_accuracy"] = ((*grid_dims, "target_position"), _ratio(stack("grid_correct"), stack("grid_total")))
        data["grid_bin_accuracy"] = ((*grid_dims, "bin"), _ratio(stack("grid_bin_correct"), stack("grid_bin_total")))
        data["grid_n"] = (("target_group", "disturbant_group", "bin"), first.grid_bin_total)
        data["grid_total"] = (("target_group", "disturbant_group", "target_position"), first.grid_total)
        coords.update({"target_group": groups, "disturbant_group": groups,
                       "target_position": np.arange(1, first.grid_correct.shape[-1] + 1),
                       "bin": np.arange(len(edges)), "bin_start": ("bin", np.array([a for a, _ in edges])),
                       "bin_end": ("bin", np.array([b for _, b in edges]))})
    family = family_of(config.task.name if isinstance(config, RunConfig) else config["task_config"].get("name"))
    if family is not None and first.family:  # the task family's own part, as it declares
        part, part_coords = family.accuracy_part([r.family for r in results])
        data.update(part)
        coords.update(part_coords)
    if first.decodings:  # a feedback model: every decoding evaluated, side by side
        correct, scored = stack("decoded_time_correct"), stack("decoded_time_scored")  # (C, D, T)
        data["decoded_token_accuracy"] = (("checkpoint", "decoding"), _ratio(correct.sum(-1), scored.sum(-1)))
        data["decoded_position_accuracy"] = (("checkpoint", "decoding", "time"), _ratio(correct, scored)[..., scored_times])
        coords["decoding"] = np.asarray(first.decodings, dtype=object)
    if first.item_time_correct is not None:  # an extended vocabulary: old and new target items
        correct, scored = stack("item_time_correct"), stack("item_time_scored")  # (C, 2, T)
        data["item_accuracy"] = (("checkpoint", "item"), _ratio(correct.sum(-1), scored.sum(-1)))
        data["item_position_accuracy"] = (("checkpoint", "item", "time"), _ratio(correct, scored)[..., scored_times])
        data["item_n"] = ("item", scored[0].sum(-1))
        coords["item"] = np.asarray(ITEM_NAMES, dtype=object)
        if first.grid_item_correct is not None:
            edges = bin_edges(first.grid_item_correct.shape[-1], options["bins"])
            binned = lambda x: np.stack([x[..., a - 1:b].sum(-1) for a, b in edges], axis=-1)  # noqa: E731
            data["grid_item_bin_accuracy"] = (("checkpoint", "target_group", "disturbant_group", "item", "bin"),
                                              _ratio(binned(stack("grid_item_correct")), binned(stack("grid_item_total"))))
    checkpoints = [{"path": str(r.path), "iteration": r.iteration, "run": r.run,
                    "sha256": sha256_file(r.path) if r.path.is_file() else ""} for r in results]
    coords["sha256"] = ("checkpoint", np.asarray([c["sha256"] for c in checkpoints], dtype=object))
    configs = config if isinstance(config, dict) else {
        "model_config": dataclasses.asdict(config.model), "task_config": dataclasses.asdict(config.task),
        "train_config": dataclasses.asdict(config.train)}
    attrs = provenance("accuracy", command, device, {**configs, "checkpoints": checkpoints, "options": options})
    return xr.Dataset(data, coords=coords, attrs=attrs)


def family_dataset(results: list[FamilyResult], config: RunConfig, options: dict[str, Any], command: str,
                   device: str) -> xr.Dataset:
    """The accuracy store of a family whose store is its own part alone (no token part): the
    checkpoints' coordinates, and the variables and coordinates its ``accuracy_part`` gives."""
    family = family_of(config.task.name)
    assert family is not None and not family.token_part
    checkpoints = [{"path": str(r.path), "iteration": r.iteration, "run": r.run, "sha256": sha256_file(r.path)}
                   for r in results]
    data, part_coords = family.accuracy_part([r.family for r in results])
    coords: dict[str, Any] = {
        "checkpoint": np.arange(len(results)),
        "iteration": ("checkpoint", np.array([r.iteration for r in results])),
        "checkpoint_path": ("checkpoint", np.asarray([str(r.path) for r in results], dtype=object)),
        "run": ("checkpoint", np.asarray([r.run for r in results], dtype=object)),
        "sha256": ("checkpoint", np.asarray([c["sha256"] for c in checkpoints], dtype=object)),
        **part_coords,
    }
    attrs = provenance("accuracy", command, device, {
        "model_config": dataclasses.asdict(config.model), "task_config": dataclasses.asdict(config.task),
        "train_config": dataclasses.asdict(config.train), "checkpoints": checkpoints, "options": options,
    })
    return xr.Dataset(data, coords=coords, attrs=attrs)


def store_family(ds: xr.Dataset) -> type[Task] | None:
    """The registered task family an accuracy store was made on (None: not one of them)."""
    task = attr_json(ds, "task_config") if "task_config" in ds.attrs else {}  # read_store checked it is an object
    name = task.get("name") if isinstance(task, dict) else None
    return family_of(name)


def family_values(ds: xr.Dataset, at: int = -1) -> tuple[type[Task] | None, dict[str, np.ndarray]]:
    """The store's family and its declared variables present in ``ds``, those over checkpoints taken
    at checkpoint index ``at`` (a family's ``summary_metrics``, ``lines`` and report panels read these)."""
    family = store_family(ds)
    if family is None:
        return None, {}
    values = {name: (ds[name].isel(checkpoint=at) if "checkpoint" in ds[name].dims else ds[name]).values
              for name in family.layout if name in ds.variables}
    return family, values


def family_sections() -> list[tuple[str, type[Task], ReportSection]]:
    """(task name, family, report section) of every registered family that declares one, in registry order."""
    return [(name, cls, cls.report) for name, cls in TASKS.items() if cls.report is not None]
