"""The model's frozen configuration. Shared sizes live here; what only one core uses lives in that
core's own config (``core_config``, e.g. :class:`~gradscope.models.s4d.S4DConfig`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


from gradscope.errors import GradscopeError, check
from gradscope.fields import bounded, check_fields, from_dict, option, shown, text
from gradscope.models.pe import PE_TYPES
from gradscope.models.registry import CORES, core_class

PE_COMBINE = ("concat", "add")
INPUTS = ("tokens", "vectors")
MAX_SIZE = 2**31 - 1  # sizes and counts a tensor dimension can hold; memory is checked separately
MAX_LAYERS = 1024  # layers are built one Python module at a time
VOCAB_SIZE = 64  # K unless told: a task's vocabulary size, and so its model's output classes


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A sequence model: embedding (K+1 rows, row K = query token) → PE → core → Linear(H, K).

    ``core_config`` is the core's own config; None (or a plain dict of its fields) is converted to it.
    ``inputs="vectors"`` (the continuous task, paper App. B.3): the tokens are vectors of width
    d = ``vocab_size``, read by a linear projection ``Linear(d + 1, E)`` whose last input is the
    query flag (its column is the learned query vector), and ``Linear(H, d)`` is a point prediction.
    ``feedback=True`` (the autoregressive model, paper App. B.2): the output phase also reads the
    previous token through the same embedding, as id K + 1 + token, and a learned phase vector
    (input or output phase) of width E is concatenated to every input.
    """

    # option(...): a setting of `gradscope train --<field>` and of sweep specs (help: its --help text)
    core: str = option("gru", "Core: a name in gradscope's core registry ({cores}). A core's own settings follow "
                              "the training settings.")
    vocab_size: int = bounded(VOCAB_SIZE, low=1, high=MAX_SIZE)  # K output classes; the embedding has K + 1 rows (sized to the task, not a setting)
    embed_size: int = option(512, "Embedding size E.", low=1, high=MAX_SIZE)
    hidden_size: int = option(512, "Hidden size H.", low=1, high=MAX_SIZE)
    num_layers: int = option(1, "Number of layers (RNN) or S4D blocks.", low=1, high=MAX_LAYERS)
    pe: str = option("none", "Positional encoding: a kind in gradscope's PE registry ({pes}).")
    pe_combine: str = option("concat", "How PE meets the embedding: concat or add.")
    # positions a learnable/random PE covers (>= total sequence length)
    max_len: int = option(128, "Positions covered by a learnable/random PE (default: the task's length).", low=1,
                          high=MAX_SIZE)
    core_config: Any = None
    inputs: str = "tokens"
    feedback: bool = False

    def __post_init__(self) -> None:
        text("core", self.core, list(CORES))
        cls = core_class(self.core)
        if self.core_config is None or isinstance(self.core_config, dict):
            try:
                object.__setattr__(self, "core_config", from_dict(cls.Config, dict(self.core_config or {})))
            except TypeError as exc:  # a field of the wrong type, compared in the core config's checks
                raise GradscopeError(f"core_config: malformed for the {self.core!r} core ({exc})") from None
        check(type(self.core_config) is cls.Config,
              f"core_config: got {type(self.core_config).__name__}; the {self.core!r} core takes {cls.Config.__name__}")
        text("pe", self.pe, list(PE_TYPES))
        text("pe_combine", self.pe_combine, PE_COMBINE)
        text("inputs", self.inputs, INPUTS)
        check(isinstance(self.feedback, bool), f"feedback: got {shown(self.feedback)}; expected True or False")
        check(not (self.feedback and self.inputs == "vectors"),
              "feedback: the vector-input model has no token embedding to feed predictions back through")
        check_fields(self, strict=True)  # the ranges declared on the fields
        check(self.vocab_size >= 2, f"vocab_size: got {self.vocab_size}; need at least 2 tokens")
        if self.pe == "sinusoidal":
            check(self.embed_size % 2 == 0,
                  f"embed_size: got {self.embed_size}; a sinusoidal PE needs an even size")

    @property
    def core_input_size(self) -> int:
        """Width of the vector fed to the core at each step."""
        width = 2 * self.embed_size if self.pe != "none" and self.pe_combine == "concat" else self.embed_size
        return width + self.embed_size if self.feedback else width

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "ModelConfig":
        """From a plain dict. Format-1 checkpoints kept S4D's settings (state_size, dt_min, dt_max)
        among the shared fields, for every core: they move into the core's config where it has
        those fields and are dropped where it has not."""
        check(isinstance(data, dict), f"ModelConfig: expected a mapping of fields; got {type(data).__name__}")
        data = dict(data)
        shared = {f.name for f in dataclasses.fields(ModelConfig)}
        legacy = {k: data.pop(k) for k in list(data) if k not in shared and k in ("state_size", "dt_min", "dt_max")}
        if legacy and data.get("core_config") is None:
            own = {f.name for f in dataclasses.fields(core_class(str(data.get("core", "gru"))).Config)}
            data["core_config"] = {k: v for k, v in legacy.items() if k in own}
        return from_dict(ModelConfig, data)


def model_fields(config: dict[str, Any]) -> dict[str, Any]:
    """A model config dict (format 1 or 2) flattened the same way: the core's own fields beside the
    shared ones, and no S4D setting on another core (how summaries and report labels compare them).
    A dict that is not a gradscope model config (a wrapped model's description) is returned as is."""
    try:
        config = dataclasses.asdict(ModelConfig.from_dict(config))
    except (GradscopeError, TypeError):
        pass
    flat = {k: v for k, v in config.items() if k != "core_config"}
    core_config = config.get("core_config")
    if isinstance(core_config, dict):
        flat.update(core_config)
    return flat
