"""`gradscope corpus prepare`: raw text → tokenised, memory-mapped corpus (gradscope.corpus)."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gradscope.workflows.study.options import CorpusOptions  # torch-free: --help builds the options from it

from .common import SETTINGS, make_console, warn
from .errors import user_errors
from .generated import build_options, generated_command

console = make_console()
Opt = typer.Option
corpus_app = typer.Typer(name="corpus", help="Text corpora to train on (gradscope train --corpus DIR).", no_args_is_help=True,
                         add_completion=False, rich_markup_mode=None)


# the corpus settings (each --<field>, its help and default from CorpusOptions' field) are generated
PrepareCommand = generated_command(CorpusOptions, after="out")


@corpus_app.command("prepare", cls=PrepareCommand)
@user_errors
def prepare_command(
    ctx: typer.Context,
    raw: Annotated[Path, typer.Argument(help="UTF-8 text, one paragraph per line (e.g. WikiText-103's wiki.train.raw); WikiText headings and blank lines are dropped.", show_default=False)],
    out: Annotated[Path, Opt("--out", "-o", help="Corpus directory to create (must not exist).")],
    quiet: Annotated[bool, Opt("--quiet", "-q", help="No progress display.")] = False,
) -> None:
    """Strip headings and blank lines, train a SentencePiece tokenizer on the train split, and write
    the splits as memory-mapped token arrays with counts and a manifest. The settings (--vocab …
    --test-file) are CorpusOptions' fields."""
    from gradscope.workflows.corpus import SplitLeakWarning, prepare_corpus

    settings = build_options(CorpusOptions, ctx.meta.get(SETTINGS, {}))  # every value checked in its __post_init__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SplitLeakWarning)
        if quiet:
            corpus = prepare_corpus(raw, out, opts=settings)
        else:  # a spinner with the stage and its elapsed time (tokenizer training on WikiText-103 takes minutes)
            with console.status("preparing the corpus") as status:
                clock = time.perf_counter()
                corpus = prepare_corpus(raw, out, opts=settings,
                                        on_stage=lambda text: (status.update(text + " …"), console.print(
                                            f"{time.perf_counter() - clock:7.1f} s  {text}", markup=False)))
    for w in caught:
        if issubclass(w.category, SplitLeakWarning):
            warn(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    for name, info in corpus.manifest["splits"].items():
        console.print(f"{name}: {info['paragraphs']} paragraphs, {info['tokens']} tokens")
    seen = int((corpus.counts > 0).sum())
    console.print(f"vocabulary: {corpus.vocab_size} pieces, {seen} seen in train; manifest sha256 {corpus.sha256[:16]}…")
    console.print(escape(f"wrote {out}"))
