"""Named starting configurations. Explicit options override preset values field by field."""

from __future__ import annotations

import dataclasses
from typing import Any

from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.errors import GradscopeError, check
from gradscope.models import core_class
from gradscope.models.pe import PE_TYPES, reads_max_len
from gradscope.models.registry import CORES, core_options
from gradscope.tasks import TASKS, make_task
from gradscope.tasks.registry import check_settings

PRESETS: dict[str, RunConfig] = {
    # About a minute on 2 CPU cores: dual-frequency reverse, small GRU.
    "tiny": RunConfig(
        model=ModelConfig(core="gru", embed_size=32, hidden_size=64),
        task=TaskConfig(name="reverse", vocab_size=16, length=8, distribution="dual", heldout_size=256,
                        grid_per_cell=8),
        train=TrainConfig(iterations=3000, batch_size=64, lr=1e-2, warmup=100, checkpoint_every=500,
                          log_every=50),
    ),
    # SPEC §3 hyperparameters (meant for a GPU): E = H = 512, L = 64, batch 512, 300k iterations.
    "paper": RunConfig(
        model=ModelConfig(core="gru", embed_size=512, hidden_size=512),
        task=TaskConfig(name="reverse", vocab_size=64, length=64, distribution="uniform", heldout_size=1024,
                        grid_per_cell=16),
        train=TrainConfig(iterations=300_000, batch_size=512, lr=1e-3, warmup=1000, checkpoint_every=5000,
                          log_every=100),
    ),
}


def _study(core: str, vocab: int, **train: object) -> RunConfig:
    """The CPU-scale study configuration (issue #6): dual-frequency reverse, L = 16, about 5–10
    minutes per model on 2 CPU cores. Starting point: the GRU region measured in FACTS.md."""
    return RunConfig(
        model=ModelConfig(core=core, embed_size=64, hidden_size=128),
        task=TaskConfig(name="reverse", vocab_size=vocab, length=16, distribution="dual", rarity=0.125,
                        heldout_size=1024, grid_per_cell=16),
        train=TrainConfig(**{"iterations": 6000, "batch_size": 128, "lr": 3e-3, "warmup": 200,
                             "checkpoint_every": 1500, "log_every": 100, **train}),
    )


def _paper(core: str, vocab: int) -> RunConfig:
    """SPEC §3 at paper scale: E = H = 512, L = 64, batch 512, 300k iterations (for a GPU)."""
    return RunConfig(
        model=ModelConfig(core=core, embed_size=512, hidden_size=512),
        task=TaskConfig(name="reverse", vocab_size=vocab, length=64, distribution="dual", rarity=0.125,
                        heldout_size=1024, grid_per_cell=16),
        train=TrainConfig(iterations=300_000, batch_size=512, lr=1e-3, warmup=1000, checkpoint_every=5000),
    )


SCALES = ("tiny", "paper")
# The dual-frequency vocabularies of the paper's Figure 3 (GRU K=64, LSTM K=1024, S4D K=2048); a
# core the paper did not study gets K = 64.
PAPER_VOCAB = {"gru": 64, "lstm": 1024, "s4d": 2048}


def scale_configs(scale: str) -> dict[str, RunConfig]:
    """core → base configuration of the study at ``scale`` (vanilla; `gradscope reproduce` adds the
    PE variant), for every registered core."""
    check(scale in SCALES, f"scale: got {scale!r}; valid scales are {', '.join(SCALES)}")
    if scale == "tiny":
        return {core: _study(core, 64) for core in CORES}
    return {core: _paper(core, PAPER_VOCAB.get(core, 64)) for core in CORES}


# option name (as in `gradscope train --<name>` and a sweep spec) → (config section, field); the
# cores' own options (:func:`option_fields`) come from the registry.
FIELDS: dict[str, tuple[str, str]] = {
    "model": ("model", "core"), "pe": ("model", "pe"), "pe_combine": ("model", "pe_combine"),
    "layers": ("model", "num_layers"), "embed": ("model", "embed_size"), "hidden": ("model", "hidden_size"),
    "max_len": ("model", "max_len"),
    "task": ("task", "name"), "vocab": ("task", "vocab_size"), "length": ("task", "length"),
    "min_length": ("task", "min_length"), "distribution": ("task", "distribution"), "rarity": ("task", "rarity"),
    "heldout": ("task", "heldout_size"), "grid_per_cell": ("task", "grid_per_cell"),
    "hold_min": ("task", "hold_min"), "hold_max": ("task", "hold_max"), "dim": ("task", "dim"),
    "corpus": ("task", "corpus"),
    "iterations": ("train", "iterations"), "batch_size": ("train", "batch_size"), "lr": ("train", "lr"),
    "warmup": ("train", "warmup"), "eps": ("train", "eps"), "clip": ("train", "clip"),
    "checkpoint_every": ("train", "checkpoint_every"), "log_every": ("train", "log_every"),
    "seed": ("train", "seed"), "device": ("train", "device"), "threads": ("train", "threads"),
    "decoding": ("train", "decoding"),
}


def option_fields() -> dict[str, tuple[str, str]]:
    """:data:`FIELDS` and every registered core's own options (section "core")."""
    own = {name: ("core", name) for name in core_options()}
    clash = sorted(set(own) & set(FIELDS))
    if clash:
        raise GradscopeError(f"core options {', '.join(clash)} clash with shared settings of the same name")
    return {**FIELDS, **own}


def _checked(name: str, value: Any, default: Any) -> Any:
    """``value`` if it has the type of the field's ``default`` (an int is accepted for a float)."""
    kind = type(default)
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > 1e300:
            raise GradscopeError(f"{name}: got {value}; it is too large for a number")
        return float(value)
    if not ok:
        raise GradscopeError(f"{name}: got {value!r}; expected {'a number' if kind is float else kind.__name__}")
    return value


def build_config(preset: str, options: dict[str, Any]) -> RunConfig:
    """Preset values, overridden by every option given (names as in :func:`option_fields`, plus beta1
    and beta2); the model's vocabulary and PE length are sized to the task."""
    if preset not in PRESETS:
        raise GradscopeError(f"preset: got {preset!r}; valid presets are {', '.join(PRESETS)}")
    try:
        return _build(PRESETS[preset], options)
    except GradscopeError as exc:  # a config field's error, in the name of the option that sets it
        field, sep, rest = str(exc).partition(":")
        option = {f: name for name, (_, f) in FIELDS.items()}.get(field)
        if sep and option is not None and options.get(option) is not None:  # the option the user gave
            raise GradscopeError(f"{option}{sep}{rest}") from None
        raise


def _build(base: RunConfig, options: dict[str, Any]) -> RunConfig:
    sections: dict[str, dict[str, Any]] = {"model": {}, "task": {}, "train": {}, "core": {}}
    core = options.get("model") or base.model.core
    check(isinstance(core, str), f"model: got {str(core)[:40]!r}; expected the name of a core")
    own = core_class(core).Config() if core != base.model.core else base.model.core_config
    fields = option_fields()
    for name, value in options.items():
        if value is not None and name in fields:
            section, field = fields[name]
            if section == "core":  # a setting of the chosen core's own config
                check(hasattr(own, field), f"{name}: the {core!r} core has no {field} setting")
                default = getattr(own, field)
            else:
                default = getattr(getattr(base, section), field)
            sections[section][field] = _checked(name, value, default)
    if options.get("beta1") is not None or options.get("beta2") is not None:
        b1, b2 = base.train.betas
        sections["train"]["betas"] = tuple(b if options.get(k) is None else _checked(k, options[k], b)
                                           for k, b in (("beta1", b1), ("beta2", b2)))
    pe = sections["model"].get("pe", base.model.pe)
    if pe in PE_TYPES:  # PE settings a run without that PE would record and ignore
        check(options.get("pe_combine") is None or pe != "none",
              "pe_combine: it says how a PE meets the embedding, and this run has none (--pe none); leave it out")
        check(options.get("max_len") is None or reads_max_len(pe),
              f"max_len: it sizes the position table of a learnable or random PE; the {pe} PE has none; leave it out")
    name = sections["task"].get("name", base.task.name)
    if name in TASKS:
        check_settings(name, sections["task"], sections["task"].get("distribution", base.task.distribution))
    if name in TASKS and "distribution" not in TASKS[name].settings:  # the preset's dual does not apply
        sections["task"]["distribution"] = "uniform"
    if name in TASKS and TASKS[name].default_length is not None:
        sections["task"].setdefault("length", TASKS[name].default_length)
    task = dataclasses.replace(base.task, **sections["task"])
    if task.name in TASKS:
        given = sections["task"].get("vocab_size")
        check(given is None or TASKS[task.name].inputs == "tokens",
              f"vocab: the {task.name} task's tokens are vectors whose width is dim (--dim), not a vocabulary; "
              f"leave --vocab out")
        task = TASKS[task.name].resolve(task)
        check(given is None or given == task.vocab_size,
              f"vocab: got {given}; the {task.name} task's corpus has {task.vocab_size} tokens (leave --vocab out)")
    sections["model"].setdefault("vocab_size", make_task(task).num_classes)
    sections["model"].setdefault("inputs", make_task(task).inputs)  # token ids or vectors (the continuous task)
    sections["model"]["feedback"] = sections["train"].get("decoding", base.train.decoding) != "none"
    sections["model"].setdefault("max_len", max(base.model.max_len, make_task(task).total_len))
    sections["model"]["core_config"] = dataclasses.replace(own, **sections["core"])
    return RunConfig(model=dataclasses.replace(base.model, **sections["model"]), task=task,
                     train=dataclasses.replace(base.train, **sections["train"]))
