"""Named starting configurations. Explicit options override preset values field by field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.errors import GradscopeError, check
from gradscope.fields import SCALES, listed, with_names
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
    # docs/definitions.md §3 hyperparameters (meant for a GPU): E = H = 512, L = 64, batch 512, 300k iterations.
    "paper": RunConfig(
        model=ModelConfig(core="gru", embed_size=512, hidden_size=512),
        task=TaskConfig(name="reverse", vocab_size=64, length=64, distribution="uniform", heldout_size=1024,
                        grid_per_cell=16),
        train=TrainConfig(iterations=300_000, batch_size=512, lr=1e-3, warmup=1000, checkpoint_every=5000,
                          log_every=100),
    ),
}


def _study(core: str, vocab: int, **train: object) -> RunConfig:
    """The CPU-scale study configuration: dual-frequency reverse, L = 16, about 5–10
    minutes per model on 2 CPU cores. Starting point: the GRU region measured in FACTS.md."""
    return RunConfig(
        model=ModelConfig(core=core, embed_size=64, hidden_size=128),
        task=TaskConfig(name="reverse", vocab_size=vocab, length=16, distribution="dual", rarity=0.125,
                        heldout_size=1024, grid_per_cell=16),
        train=TrainConfig(**{"iterations": 6000, "batch_size": 128, "lr": 3e-3, "warmup": 200,
                             "checkpoint_every": 1500, "log_every": 100, **train}),
    )


def _paper(core: str, vocab: int) -> RunConfig:
    """docs/definitions.md §3 at paper scale: E = H = 512, L = 64, batch 512, 300k iterations (for a GPU)."""
    return RunConfig(
        model=ModelConfig(core=core, embed_size=512, hidden_size=512),
        task=TaskConfig(name="reverse", vocab_size=vocab, length=64, distribution="dual", rarity=0.125,
                        heldout_size=1024, grid_per_cell=16),
        train=TrainConfig(iterations=300_000, batch_size=512, lr=1e-3, warmup=1000, checkpoint_every=5000),
    )


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


@dataclass(frozen=True)
class Setting:
    """A setting of a run: ``gradscope train --<name>``, a key of a sweep spec and of
    :func:`build_config`'s options. ``name`` is the config field's own name (the task's ``name`` is
    ``task``, as its errors say), so an error naming the field names the setting."""

    name: str
    section: str  # model, task, train, or core (the chosen core's own config)
    field: str
    kind: type
    help: str
    low: float | None = None
    high: float | None = None
    cores: tuple[str, ...] = ()  # section core: the cores that have it


SECTIONS = {"model": ModelConfig, "task": TaskConfig, "train": TrainConfig}
BETAS = ("beta1", "beta2")  # TrainConfig.betas, one setting per value


def registered_choices() -> dict[str, str]:
    """The names each registry holds now, for help texts: placeholder → "a, b or c"."""
    return {"{tasks}": listed(list(TASKS)), "{cores}": listed(list(CORES)), "{pes}": listed(list(PE_TYPES))}


def with_choices(text: str) -> str:
    """A help text with its registry placeholders ({tasks}, {cores}, {pes}) replaced by the names
    registered now, so no list of choices is written by hand."""
    if "{" not in text:
        return text
    for placeholder, names in registered_choices().items():
        text = text.replace(placeholder, names)
    return with_names(text)


def settings() -> dict[str, Setting]:
    """Every setting, by name: the fields of the config sections declared with
    :func:`gradscope.fields.option`, then every registered core's own options (section "core").
    Computed on each call, so a core registered at run time has its own. Names are unique."""
    out: dict[str, Setting] = {}

    def add(setting: Setting) -> None:
        taken = out[setting.name].section if setting.name in out else \
            "train" if setting.name in BETAS else None
        if taken is not None:
            raise GradscopeError(f"setting {setting.name}: declared by {setting.section} and {taken}; a setting's "
                                 f"name must be unique across sections (and the cores' own options)")
        out[setting.name] = setting

    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if "help" in f.metadata:
                low, high = f.metadata.get("range", (None, None))
                add(Setting(f.metadata.get("flag") or f.name, section, f.name, type(f.default),
                            with_choices(f.metadata["help"]), low, high))
    for name, o in core_options().items():
        add(Setting(name, "core", name, o.kind, o.help, o.low, o.high, o.cores))
    return out


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
    """Preset values, overridden by every option given (names as in :func:`settings`, plus beta1
    and beta2); the model's
    vocabulary and PE length are sized to the task. An error names the setting, as its field."""
    check(preset in PRESETS, f"preset: got {preset!r}; valid presets are {', '.join(PRESETS)}")
    check_setting_names(options)
    return _build(PRESETS[preset], options)


def check_setting_names(options: dict[str, Any]) -> None:
    """Refuse a name in ``options`` that is no setting of a run (:func:`settings`, beta1, beta2): a misspelt
    name would be silently ignored."""
    unknown = sorted(set(options) - set(settings()) - set(BETAS))
    check(not unknown, f"{unknown[0] if unknown else ''}: not a setting of a run; valid settings are "
                       f"{', '.join([*settings(), *BETAS])}")


def _build(base: RunConfig, options: dict[str, Any]) -> RunConfig:
    sections: dict[str, dict[str, Any]] = {"model": {}, "task": {}, "train": {}, "core": {}}
    core = options.get("core") or base.model.core
    check(isinstance(core, str), f"core: got {str(core)[:40]!r}; expected the name of a core")
    own = core_class(core).Config() if core != base.model.core else base.model.core_config
    known = settings()
    for name, value in options.items():
        if value is not None and name in known:
            section, field = known[name].section, known[name].field
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
              f"vocab_size: the {task.name} task's tokens are vectors whose width is dim (--dim), not a "
              f"vocabulary; leave --vocab-size out")
        task = TASKS[task.name].resolve(task)
        check(given is None or given == task.vocab_size,
              f"vocab_size: got {given}; the {task.name} task's corpus has {task.vocab_size} tokens (leave "
              f"--vocab-size out)")
    sections["model"].setdefault("vocab_size", make_task(task).num_classes)
    sections["model"].setdefault("inputs", make_task(task).inputs)  # token ids or vectors (the continuous task)
    sections["model"]["feedback"] = sections["train"].get("decoding", base.train.decoding) != "none"
    sections["model"].setdefault("max_len", max(base.model.max_len, make_task(task).total_len))
    sections["model"]["core_config"] = dataclasses.replace(own, **sections["core"])
    return RunConfig(model=dataclasses.replace(base.model, **sections["model"]), task=task,
                     train=dataclasses.replace(base.train, **sections["train"]))
