"""Where a command's model comes from, resolved once, the same from Python and the command line.

A source is one of :data:`~gradscope.workflows.options.SOURCES`:

- ``checkpoints``: gradscope checkpoint files and run directories (every checkpoint of a run, oldest first), or
  :class:`~gradscope.files.checkpoint.Loaded` checkpoints;
- ``model``: a model in memory (``gradscope.wrap(...)``, ``gradscope.load(...).model``);
- ``factory``: the model that ``model_factory`` builds from one checkpoint file or directory (the user's code,
  ``FILE.py:FUNC``, or a transformers class, ``hf[:CLASS]``);
- ``text``: a transformers model (a directory, or a model in memory with its tokenizer) read on a raw text.

:func:`source_of` checks which options go together (``config`` with a factory, ``counts_text`` and
``tokenizer`` with a text, one path for a factory or a text); :func:`check_reads` refuses the options of a
command that the source does not read, in one line each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from gradscope.errors import check
from gradscope.files.checkpoint import Loaded
from gradscope.fields import leave_out, with_overrides
from gradscope.workflows.families.options import FAMILY_OPTIONS
from gradscope.workflows.options import SourceOptions


@dataclass(frozen=True)
class TextSource:
    """Where text probes come from, named as the flags: ``text`` (raw UTF-8), ``counts_text`` (the text
    whose counts define the groups; None: ``text``), ``tokenizer`` (its folder; None: the model's
    directory), ``cache`` (keep the tokenised text beside it)."""

    text: str
    counts_text: str | None = None
    tokenizer: str | None = None
    cache: bool = True


@dataclass(frozen=True)
class Source:
    """A resolved source (module docstring): its ``kind``, the ``paths`` it names (checkpoints; one file or
    directory for a factory or a text read from disk), the ``model`` in memory, the ``factory`` and its
    ``config`` (a weights file's config.json), and the ``text``."""

    kind: str
    paths: tuple[Path | Loaded, ...] = ()
    model: nn.Module | None = None
    factory: str | None = None
    config: Path | None = None
    text: TextSource | None = None

    @property
    def path(self) -> Path:
        """The one file or directory of a factory or text source."""
        check(len(self.paths) == 1 and isinstance(self.paths[0], Path),
              f"checkpoint: a {self.kind} source names one file or directory")
        return self.paths[0]  # type: ignore[return-value]

    @property
    def label(self) -> str:
        return "a model in memory" if self.model is not None else str(self.paths[0]) if self.paths else ""


def _paths(source: Any) -> list[Path | Loaded]:
    items = list(source) if isinstance(source, (list, tuple)) else [source]
    check(bool(items), "checkpoint: give at least one checkpoint file or run directory")
    for item in items:
        check(isinstance(item, (str, Path, Loaded)),
              f"checkpoint: got {type(item).__name__}; expected a checkpoint file or run directory, a Loaded "
              f"checkpoint, a model (gradscope.wrap(...)) or gradscope.source(...)")
    return [item if isinstance(item, Loaded) else Path(item) for item in items]


def source_of(source: Any, opts: SourceOptions | None = None, **overrides: Any) -> Source:
    """The :class:`Source` of ``source`` (a path, a list of them, a ``Loaded``, a model in memory, or a
    :class:`Source` already) and the :class:`~gradscope.workflows.options.SourceOptions` ``opts`` with
    ``overrides`` (model_factory, config, text, counts_text, tokenizer): one error line when they do not go
    together."""
    opts = with_overrides(SourceOptions, opts, overrides, "source")
    if isinstance(source, Source):
        check(opts == SourceOptions(), "source: it is resolved already; give model_factory, config and text to "
                                       "gradscope.source(...)")
        return source
    check(opts.config is None or opts.model_factory is not None,
          "config: it goes with model_factory hf:CLASS and a weights file")
    if opts.text is None:
        extra = [n for n in ("counts_text", "tokenizer") if getattr(opts, n) is not None]
        check(not extra, f"{'/'.join(extra)}: they apply to text (probes drawn from a raw text); leave "
                         f"{'them' if len(extra) > 1 else 'it'} out")
    text = None if opts.text is None else TextSource(
        str(opts.text), None if opts.counts_text is None else str(opts.counts_text),
        None if opts.tokenizer is None else str(opts.tokenizer))
    if isinstance(source, nn.Module):
        check(opts.model_factory is None, "model_factory: it builds a model from a file; this model is in memory")
        if text is not None:
            check(opts.tokenizer is not None, "tokenizer: a model in memory needs the folder of its tokenizer")
            return Source("text", model=source, text=text)
        return Source("model", model=source)
    paths = _paths(source)
    if text is not None:
        check(opts.model_factory is not None,
              "text: it needs a model with its own tokenizer: DIR --model hf --text FILE (a gradscope checkpoint "
              "draws its probes from its own task or corpus)")
        check(len(paths) == 1 and isinstance(paths[0], Path), "checkpoint: with text give exactly one model directory")
        return Source("text", paths=tuple(paths), factory=opts.model_factory, config=opts.config, text=text)
    if opts.model_factory is not None:
        check(len(paths) == 1 and isinstance(paths[0], Path),
              "checkpoint: with model_factory give exactly one checkpoint file")
        return Source("factory", paths=tuple(paths), factory=opts.model_factory, config=opts.config)
    return Source("checkpoints", paths=tuple(paths))


# the options each kind of source does not read, per command, and why; a task family's own options
# (FAMILY_OPTIONS, such as where the corpus a checkpoint trained on lies now) are read for a gradscope checkpoint
# of that family only
OWN = ("a task family's own options, read for a gradscope checkpoint of that family (the corpus it trained on, say); "
       "a model of your own has none")
NOT_READ: dict[str, dict[str, tuple[tuple[str, ...], str]]] = {
    "stability": {
        "checkpoints": (("token_counts", "filler"), "they describe probes for a model of your own (--model-factory); "
                                                    "gradscope checkpoints generate their own"),
        "model": (FAMILY_OPTIONS, OWN),
        "factory": (FAMILY_OPTIONS, OWN),
        "text": (("probes", "token_counts", "filler", *FAMILY_OPTIONS), "with text the probes are drawn from the text, "
                                                                        "which is the corpus too; no output phase follows"),
    },
    "dynamics": {
        "checkpoints": (("length", "token_counts"), "they describe probes for a model of your own (--model-factory); "
                                                    "a gradscope checkpoint draws its probes from its task"),
        "model": (("target_freq", "disturbant", "length", *FAMILY_OPTIONS), "a model in memory is given its probe "
                                                                             "tokens, and has no task family"),
        "factory": (("target_freq", "disturbant", *FAMILY_OPTIONS), "a model of your own has no task family, groups or "
                                                                     "corpus of its own (describe its tokens with token_counts)"),
        "text": (("target_freq", "disturbant", "token_counts", *FAMILY_OPTIONS), "with text the steps are classed by "
                                                                                 "the text's own counts (or counts_text)"),
    },
    "accuracy": {
        "checkpoints": (("max_length",), "it applies to text (a pretrained LM on raw text)"),
        "text": (("bins", "grid", "decoding", *FAMILY_OPTIONS), "they apply to gradscope checkpoints, not to text"),
    },
}
# the kinds of source a command reads at all (others: every kind); a model of one's own has no held-out set, so
# accuracy reads it on a text or not at all
READS = {"accuracy": ("checkpoints", "text")}


def check_reads(source: Source, opts: Any, command: str) -> None:
    """Refuse a kind of source ``command`` does not read (:data:`READS`), and, in one line naming them, the options
    of ``opts`` set away from their defaults that it does not read for ``source``'s kind (:data:`NOT_READ`):
    recorded and ignored otherwise."""
    check(source.kind in READS.get(command, (source.kind,)),
          "text/model_factory: they go together: accuracy DIR --model hf --text FILE (a pretrained LM on raw text); a "
          "model of your own has no held-out set otherwise")
    names, why = NOT_READ[command][source.kind]
    defaults = {f.name: f.default for f in dataclasses.fields(opts)}
    given = [n for n in names if getattr(opts, n) != defaults[n]]
    check(not given, leave_out(given, why))
