"""gradscope.workflows.sources: one home for where a command's model comes from. A path, a list, a Loaded
checkpoint, a model in memory, a factory or a text resolve to one Source, with the rules on which options go
together; the options a command does not read for a source are refused in one line, the same from Python and
the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import gradscope
from gradscope.cli.app import app
from gradscope.errors import GradscopeError
from gradscope.workflows.options import AccuracyOptions, DynamicsOptions, SourceOptions, StabilityOptions
from gradscope.workflows.options import SOURCES
from gradscope.workflows.sources import NOT_READ, READS, Source, TextSource, check_reads, source_of

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "sample_checkpoints" / "gru-none-s1"


def test_each_kind_of_source_resolves() -> None:
    assert source_of(RUN) == Source("checkpoints", paths=(RUN,))
    assert source_of([str(RUN), RUN]).paths == (RUN, RUN)
    model = gradscope.wrap(nn.GRU(4, 6, batch_first=True).eval())
    assert source_of(model) == Source("model", model=model)
    factory = source_of(RUN / "step-0006000.pt", model_factory="mine.py:build")
    assert (factory.kind, factory.factory, factory.path) == ("factory", "mine.py:build", RUN / "step-0006000.pt")
    text = source_of(RUN, SourceOptions(model_factory="hf", text="t.txt", counts_text="c.txt"))
    assert text.kind == "text" and text.text == TextSource("t.txt", "c.txt", None) and text.factory == "hf"
    in_memory = source_of(model, text="t.txt", tokenizer="tok")
    assert in_memory.kind == "text" and in_memory.model is model and in_memory.text == TextSource("t.txt", None, "tok")
    assert source_of(text) is text  # resolved once, used again
    assert gradscope.source(RUN) == source_of(RUN)


@pytest.mark.parametrize(("make", "head"), [
    (lambda: source_of(RUN, config="c.json"), "config: it goes with model_factory"),
    (lambda: source_of(RUN, counts_text="c.txt", tokenizer="t"), "counts_text/tokenizer: they apply to text"),
    (lambda: source_of(RUN, text="t.txt"), "text: it needs a model with its own tokenizer"),
    (lambda: source_of([RUN, RUN], model_factory="hf", text="t.txt"), "checkpoint: with text give exactly one"),
    (lambda: source_of([RUN, RUN], model_factory="hf"), "checkpoint: with model_factory give exactly one"),
    (lambda: source_of(nn.Linear(2, 2), model_factory="hf"), "model_factory: it builds a model from a file"),
    (lambda: source_of(nn.Linear(2, 2), text="t.txt"), "tokenizer: a model in memory needs"),
    (lambda: source_of([]), "checkpoint: give at least one"),
    (lambda: source_of(3), "checkpoint: got int"),
    (lambda: source_of(source_of(RUN), model_factory="hf"), "source: it is resolved already"),
    (lambda: source_of(RUN, factory="hf"), "factory: not an option of source"),
])
def test_options_that_do_not_go_together_are_one_error(make, head: str) -> None:  # noqa: ANN001
    with pytest.raises(GradscopeError, match=f"^{head}"):
        make()


def test_what_a_command_does_not_read_for_a_source_is_refused() -> None:
    """Every (command, kind) pair names only fields of the command's options; each one given is refused."""
    classes = {"stability": StabilityOptions, "dynamics": DynamicsOptions, "accuracy": AccuracyOptions}
    assert set(NOT_READ) == set(classes)
    for command, kinds in NOT_READ.items():
        fields = set(classes[command].__dataclass_fields__)
        for kind, (names, _) in kinds.items():
            assert set(names) <= fields, (command, kind)
            check_reads(Source(kind), classes[command](), command)  # the defaults pass
            with pytest.raises(GradscopeError, match=f"^{names[0]}: "):
                value = ("rare",) if names[0] in ("target_freq", "disturbant") else 4 if names[0] in (
                    "length", "filler", "max_length", "bins") else Path("x")
                check_reads(Source(kind), classes[command](**{names[0]: value}), command)
    for command, kinds in READS.items():  # accuracy of a model of one's own: only on a text
        for kind in set(SOURCES) - set(kinds):
            with pytest.raises(GradscopeError, match="^text/model_factory: they go together"):
                check_reads(Source(kind), classes[command](), command)


def test_the_cli_and_python_refuse_alike(tmp_path: Path) -> None:
    """The rule is the workflow's: the CLI prints the same message with flags."""
    with pytest.raises(GradscopeError, match="^length/token_counts: they describe probes for a model of your own"):
        gradscope.dynamics(RUN, length=8, token_counts=tmp_path / "c.npy")
    result = CliRunner().invoke(app, ["dynamics", str(RUN), "--length", "8", "-o", str(tmp_path / "d.zarr")])
    assert result.exit_code == 2 and result.stderr.startswith("error: --length: they describe probes"), result.stderr
    result = CliRunner().invoke(app, ["stability", str(RUN), "--counts-text", "c.txt", "-o", str(tmp_path / "s.zarr")])
    assert result.exit_code == 2 and result.stderr == "error: --counts-text: they apply to text (probes drawn from a raw text); leave it out\n"
    assert not (tmp_path / "d.zarr").exists() and not (tmp_path / "s.zarr").exists()


def test_a_model_in_memory_takes_its_tokens_and_other_sources_refuse_them() -> None:
    model = gradscope.wrap(nn.GRU(4, 6, batch_first=True).eval(), inputs=nn.Embedding(10, 4))
    tokens = torch.randint(0, 10, (2, 5), generator=torch.Generator().manual_seed(0))
    ds = gradscope.dynamics(model, tokens=tokens, parts="flow", device="cpu")
    assert ds["tokens"].shape[-1] == 5
    with pytest.raises(GradscopeError, match="^tokens/trajectory_tokens/counts: "):
        gradscope.dynamics(RUN, tokens=tokens)
    with pytest.raises(GradscopeError, match="^tokens: give the probe sequences"):
        gradscope.dynamics(model)
