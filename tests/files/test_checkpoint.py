"""Checkpoint formats: gradscope's own and the paper's public code (SPEC §6); safe loading. Real small
checkpoints of both formats, mutated field by field (deleted, replaced by a wrong type, None, NaN, 1e30,
-1, a tensor of the wrong shape or dtype, a sparse, meta or stride-0 tensor, token ids outside the
vocabulary) or byte by byte (truncated, flipped), fed to ``gradscope.load``, ``gradscope accuracy``,
``gradscope dynamics`` and ``gradscope stability``: each ends in exit 0 (and then, where the mutation did
not touch data the command reads, with exactly the unmutated numbers) or in exit 2 with one ``error:``
line; never a traceback, never a partial or changed file. The mutated sources come from
tests/files/conftest.py; resuming from mutated runs is in test_rundir.py."""

from __future__ import annotations

import math
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

import gradscope
from tests.helpers.fuzzkit import assert_clean, assert_untouched, count, invoke, snapshot
from tests.helpers.hardening import FIELD_PATHS, FUZZ, KINDS, inert, mutate, raw, stride0
from tests.helpers.runs import OTHER_CORE, small_run
from gradscope.errors import GradscopeError
from gradscope.store import read_store
from gradscope.tasks import grid_batch, make_task
from gradscope.train import train
from gradscope.train.evaluate import evaluate_heldout


def test_gradscope_checkpoint_round_trip(tmp_path: Path) -> None:
    cfg = small_run(OTHER_CORE, pe="learnable", iterations=10)
    train(cfg, tmp_path / "run")
    loaded = gradscope.load(tmp_path / "run")
    assert loaded.source == "gradscope" and loaded.iteration == 10 and loaded.config == cfg
    assert loaded.heldout.grid is not None and loaded.heldout.grid.shape == (2, 2, 2, 4, 4)
    assert loaded.heldout.uniform.inputs.shape == (64, 8)
    first = gradscope.load(tmp_path / "run" / "step-0000005.pt")
    assert first.iteration == 5
    assert not torch.equal(first.model.to_logits.weight, loaded.model.to_logits.weight)
    umask = os.umask(0)
    os.umask(umask)
    for name in ("config.json", "step-0000010.pt", "eval.json"):  # atomic writes keep the usual permissions
        assert (tmp_path / "run" / name).stat().st_mode & 0o777 == 0o666 & ~umask


def _paper_checkpoint(path: Path, rnn_name: str, grid: bool) -> tuple[dict, torch.Tensor]:
    """A file in exactly the layout the paper's code saves (SPEC §6), built from plain nn modules."""
    torch.manual_seed(11)
    K, E, H, L = 6, 4, 5, 3
    emb = nn.Embedding(K + 1, E)
    rnn = {"GRU": nn.GRU, "LSTM": nn.LSTM, "RNN": nn.RNN}[rnn_name](2 * E, H, batch_first=True)
    to_logits = nn.Linear(H, K)
    freqs = torch.exp(torch.arange(0, E, 2) * (-math.log(10000.0) / E))
    sd = {"embedding.weight": emb.weight.detach(), "time_encoder.frequencies": freqs,
          **{f"rnn.{k}": v.detach() for k, v in rnn.state_dict().items()},
          **{f"to_logits.{k}": v.detach() for k, v in to_logits.state_dict().items()}}
    held = torch.randint(0, K, (2, 2, 3, L, L) if grid else (10, L))
    ckpt = {"modules": {"rnn": {"module_name": "RNN", "state_dict": sd, "init_args": {
        "vocab_size": K, "hidden_size": H, "rnn_name": rnn_name, "embed_size": E, "time_encoding": "concat",
        "time_encoding_form": "sinusoidal", "max_length": 2 * L, "num_layers": 1, "dropout": 0.0,
        "learnable_padding_token": False}}},
        "optimizer": {}, "scheduler": {}, "random_seed": 111, "iteration": 999, "held_out_data": held}
    torch.save(ckpt, path)
    # the reference forward pass, computed here independently of gradscope
    tokens = torch.cat([held.reshape(-1, L)[:4], torch.full((4, L), K)], dim=1)
    t = torch.arange(2 * L)[:, None] * freqs[None, :]
    pe = torch.cat([t.sin(), t.cos()], dim=-1) / math.sqrt(E / 2)
    x = torch.cat([emb(tokens), pe.expand(4, -1, -1)], dim=-1)
    with torch.no_grad():
        expected = to_logits(rnn(x)[0])
    return ckpt, expected


@pytest.mark.parametrize("rnn_name", ["GRU", "LSTM", "RNN"])
@pytest.mark.parametrize("grid", [True, False])
def test_paper_checkpoint_loads_and_computes_the_same(tmp_path: Path, rnn_name: str, grid: bool) -> None:
    path = tmp_path / "checkpoint_after-1000-iters.pt"
    _, expected = _paper_checkpoint(path, rnn_name, grid)
    loaded = gradscope.load(path)
    assert loaded.source == "paper" and loaded.iteration == 1000
    assert loaded.config.model.core == {"GRU": "gru", "LSTM": "lstm", "RNN": "elman"}[rnn_name]
    assert loaded.config.model.pe == "sinusoidal" and loaded.config.train.seed == 111
    if grid:
        assert loaded.heldout.grid.shape == (2, 2, 3, 3, 3)
        inputs = grid_batch(loaded_task(loaded), loaded.heldout.grid).inputs[:4]
    else:
        inputs = loaded.heldout.uniform.inputs[:4]
    with torch.no_grad():
        got = loaded.model(inputs)
    assert torch.allclose(got, expected, atol=1e-6)
    # a run directory with paper-named checkpoints resolves too
    assert gradscope.load(tmp_path).iteration == 1000


def loaded_task(loaded: gradscope.Loaded):  # noqa: ANN201
    from gradscope.tasks import make_task
    return make_task(loaded.config.task)


def test_paper_s4d_checkpoint_loads(tmp_path: Path) -> None:
    from gradscope.config import ModelConfig
    from gradscope.models import SeqModel
    torch.manual_seed(12)
    ours = SeqModel(ModelConfig(core="s4d", vocab_size=6, embed_size=4, hidden_size=5, num_layers=2, core_config={"state_size": 8}))
    sd = {k.replace("core.", "", 1): v for k, v in ours.state_dict().items()}
    assert "ssm.1.kernel.log_A_real" in sd and "in_proj.weight" in sd
    ckpt = {"modules": {"ssm": {"module_name": "SSM", "init_args": {"vocab_size": 6}, "state_dict": sd}},
            "random_seed": 1, "iteration": 4, "held_out_data": torch.randint(0, 6, (5, 3))}
    torch.save(ckpt, tmp_path / "checkpoint_after-5-iters.pt")
    loaded = gradscope.load(tmp_path / "checkpoint_after-5-iters.pt")
    assert loaded.config.model.core == "s4d" and loaded.config.model.num_layers == 2
    assert loaded.config.model.core_config.state_size == 8
    tokens = loaded.heldout.uniform.inputs
    assert torch.allclose(loaded.model(tokens), ours(tokens), atol=1e-6)


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - a pickle that runs code when unpickled
        return (os.system, (f"touch {self.marker}",))


def test_code_running_pickle_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "PWNED"
    torch.save({"format": "gradscope-checkpoint", "x": _Payload(marker)}, tmp_path / "evil.pt")
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # must not re-enable unsafe loading
    with pytest.raises(GradscopeError, match="refused.*not plain data"):
        gradscope.load(tmp_path / "evil.pt")
    assert not marker.exists()


def test_truncated_and_foreign_files_get_clear_errors(tmp_path: Path) -> None:
    train(small_run(iterations=5), tmp_path / "run")
    data = (tmp_path / "run" / "step-0000005.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(GradscopeError, match="cannot read .*truncated"):
        gradscope.load(tmp_path / "cut.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(GradscopeError, match="cannot read"):
        gradscope.load(tmp_path / "text.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(GradscopeError, match="not a gradscope checkpoint"):
        gradscope.load(tmp_path / "other.pt")
    with pytest.raises(GradscopeError, match="does not exist"):
        gradscope.load(tmp_path / "missing.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GradscopeError, match="no checkpoints"):
        gradscope.load(tmp_path / "empty")


def same_model(a: gradscope.Loaded, b: gradscope.Loaded) -> bool:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa) and \
        torch.equal(a.heldout.uniform.inputs, b.heldout.uniform.inputs) and \
        torch.equal(a.heldout.uniform.targets, b.heldout.uniform.targets) and \
        (a.heldout.grid is None) == (b.heldout.grid is None) and \
        (a.heldout.grid is None or torch.equal(a.heldout.grid, b.heldout.grid)) and \
        a.iteration == b.iteration and a.config.model == b.config.model and a.config.task == b.config.task


def numbers(store: Path) -> dict[str, np.ndarray]:
    ds = read_store(store)
    return {k: np.asarray(v.values) for k, v in {**ds.data_vars, "iteration": ds["iteration"]}.items()}


def same_numbers(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f") for k in a)


# ---- malformed checkpoints, case by case ---------------------------------------------------------

def _held(name: str, value: Any) -> Any:
    return lambda c: mutate(c, ("heldout", name), "none") if value is None else {**c, "heldout": {**c["heldout"], name: value}}


def _set(path: tuple, value: Any) -> Any:
    def apply(c: dict) -> dict:
        out = mutate(c, path, "none")
        node = out
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return out
    return apply


NATIVE_CASES = {
    "held-out ids outside the vocabulary": lambda c: _held("uniform_inputs", c["heldout"]["uniform_inputs"] + 50)(c),
    "negative held-out ids": lambda c: _held("uniform_inputs", -c["heldout"]["uniform_inputs"] - 1)(c),
    "negative grid ids": lambda c: _held("grid", -c["heldout"]["grid"] - 1)(c),
    "1-D held-out inputs": lambda c: _held("uniform_inputs", c["heldout"]["uniform_inputs"].flatten())(c),
    "sparse held-out inputs": lambda c: _held("uniform_inputs", c["heldout"]["uniform_inputs"].to_sparse())(c),
    "meta held-out inputs": lambda c: _held("uniform_inputs", c["heldout"]["uniform_inputs"].to("meta"))(c),
    "stride-0 held-out inputs": lambda c: _held("uniform_inputs", stride0(c["heldout"]["uniform_inputs"]))(c),
    "stride-0 grid": lambda c: _held("grid", stride0(c["heldout"]["grid"], (2, 2, 10**6, 4, 4)))(c),
    "iteration a string": _set(("iteration",), "10"),
    "iteration NaN": _set(("iteration",), float("nan")),
    "iteration 1e30": _set(("iteration",), 1e30),
    "config hidden 28000": _set(("config", "model", "hidden_size"), 28000),
    "config layers 10**6": _set(("config", "model", "num_layers"), 10**6),
    "config hidden a string": _set(("config", "model", "hidden_size"), "16"),
    "config vocab 10**9": _set(("config", "task", "vocab_size"), 10**9),
    "config seed -1": _set(("config", "train", "seed"), -1),
    "config a list": _set(("config",), [1, 2]),
    "weights of the wrong shape": _set(("model", "to_logits.bias"), torch.zeros(3)),
    "format a tensor": _set(("format",), torch.zeros(2)),
}


@pytest.mark.parametrize("case", NATIVE_CASES)
def test_malformed_native_checkpoints_are_one_line_errors(case: str, sources: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "bad.pt"
    torch.save(NATIVE_CASES[case](raw(sources["gru"])), path)
    with pytest.raises(GradscopeError):
        gradscope.load(path)
    before = snapshot(tmp_path)
    for args in (["accuracy"], ["dynamics", "--sequences", "1", "--grid-sequences", "1"]):
        outcome = invoke([*args, path, "-o", tmp_path / "out.zarr", "-q", "--device", "cpu"])
        assert_clean(outcome, f"{args[0]}: {case}")
        assert outcome.rc == 2, f"{args[0]}: {case}"
        assert_untouched(before, snapshot(tmp_path))
    count("checkpoint-named", 2)


PAPER_CASES = {
    "0-d held_out_data": ("paper-gru", lambda c: {**c, "held_out_data": torch.tensor(3)}),
    "1-D held_out_data": ("paper-gru", lambda c: {**c, "held_out_data": torch.arange(5)}),
    "held_out_data outside the vocabulary": ("paper-gru", lambda c: {**c, "held_out_data": c["held_out_data"] + 6}),
    "float held_out_data": ("paper-gru", lambda c: {**c, "held_out_data": c["held_out_data"].float()}),
    "1-D S4D C": ("paper-s4d", lambda c: _set(("modules", "ssm", "state_dict", "ssm.0.kernel.C"), torch.zeros(5))(c)),
    "0-d S4D C": ("paper-s4d", lambda c: _set(("modules", "ssm", "state_dict", "ssm.0.kernel.C"), torch.tensor(1.0))(c)),
    "iteration a string": ("paper-gru", _set(("iteration",), "7")),
    "modules a list": ("paper-gru", _set(("modules",), [1])),
    "init_args a tensor": ("paper-gru", _set(("modules", "rnn", "init_args"), torch.zeros(2))),
    "time_encoding a tensor": ("paper-gru", _set(("modules", "rnn", "init_args", "time_encoding"), torch.zeros(2))),
    "grid of the wrong shape": ("paper-s4d", lambda c: {**c, "held_out_data": torch.zeros(2, 2, 2, 3, 4, dtype=torch.long)}),
}


@pytest.mark.parametrize("case", PAPER_CASES)
def test_malformed_paper_checkpoints_are_one_line_errors(case: str, sources: dict[str, Path], tmp_path: Path) -> None:
    name, spoil = PAPER_CASES[case]
    path = tmp_path / "checkpoint_after-7-iters.pt"
    torch.save(spoil(raw(sources[name])), path)
    with pytest.raises(GradscopeError):
        gradscope.load(path)
    outcome = invoke(["stability", path, "-o", tmp_path / "s.zarr", "-q", "--triplets", "2", "--resamples", "20"])
    assert_clean(outcome, case)
    assert outcome.rc == 2 and not (tmp_path / "s.zarr").exists(), case
    count("checkpoint-named", 1)


def test_a_torchscript_archive_is_one_line_without_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "scripted.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script itself is deprecated
        torch.jit.save(torch.jit.script(nn.Linear(2, 2)), path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(GradscopeError, match="TorchScript"):
            gradscope.load(path)
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # a warning shown before in this process is shown again
        outcome = invoke(["accuracy", path, "-o", tmp_path / "a.zarr", "-q"])
    assert_clean(outcome)
    assert outcome.rc == 2 and "TorchScript" in outcome.err
    count("checkpoint-named", 1)


def test_the_unmutated_sources_load_and_shipped_formats_still_read(sources: dict[str, Path]) -> None:
    for name, path in sources.items():
        loaded = gradscope.load(path)
        evaluate_heldout(loaded.model, make_task(loaded.config.task), loaded.heldout)
    assert gradscope.load(sources["paper-s4d"]).config.model.core_config.state_size == 4


# ---- property-based: every field of every source --------------------------------------------------

@st.composite
def field_mutations(draw: st.DrawFn, names: tuple[str, ...]) -> tuple[str, tuple, str]:
    name = draw(st.sampled_from(names))
    return name, draw(st.sampled_from(FIELD_PATHS[name])), draw(st.sampled_from(KINDS))


def test_field_mutations_through_load(sources: dict[str, Path], field_paths: Any, tmp_path: Path) -> None:
    """The library entry point: a GradscopeError, or a model whose held-out data evaluates (and
    equals the unmutated one where the mutation touched only what analysis ignores)."""
    base = {name: gradscope.load(path) for name, path in sources.items()}

    @settings(max_examples=100, **FUZZ)
    @given(field_mutations(tuple(sources)))
    def run(case: tuple[str, tuple, str]) -> None:
        name, path, kind = case
        target = tmp_path / sources[name].name
        torch.save(mutate(raw(sources[name]), path, kind), target)
        count("checkpoint-field-load")
        try:
            loaded = gradscope.load(target)
        except GradscopeError as exc:
            assert "\n" not in str(exc).strip()
            return
        evaluate_heldout(loaded.model, make_task(loaded.config.task), loaded.heldout)
        if inert(path):
            assert same_model(loaded, base[name]), (name, path, kind)

    run()


@pytest.fixture(scope="module")
def baseline_accuracy(sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("baseline")
    found = {}
    for name, path in sources.items():
        outcome = invoke(["accuracy", path, "-o", out / f"{name}.zarr", "-q", "--device", "cpu"])
        assert outcome.rc == 0, outcome.err
        found[name] = numbers(out / f"{name}.zarr")
    return found


def staged(tmp_path: Path, name: str, content: Any) -> tuple[Path, Path, Any]:
    """A fresh work folder holding one checkpoint file ``name`` (``content``: raw bytes, or an object
    for torch.save): (folder, file, snapshot of the folder before any command runs)."""
    work = tmp_path / "w"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    target = work / name
    if isinstance(content, bytes):
        target.write_bytes(content)
    else:
        torch.save(content, target)
    return work, target, snapshot(work)


def test_field_mutations_through_accuracy(sources: dict[str, Path], field_paths: Any, baseline_accuracy: dict,
                                          tmp_path: Path) -> None:
    @settings(max_examples=40, **FUZZ)
    @given(field_mutations(tuple(sources)))
    def run(case: tuple[str, tuple, str]) -> None:
        name, path, kind = case
        work, target, before = staged(tmp_path, sources[name].name, mutate(raw(sources[name]), path, kind))
        outcome = invoke(["accuracy", target, "-o", work / "a.zarr", "-q", "--device", "cpu"])
        count("checkpoint-field-accuracy")
        assert_clean(outcome, f"{name} {path} {kind}")
        if outcome.rc == 0:
            if inert(path):
                assert same_numbers(numbers(work / "a.zarr"), baseline_accuracy[name]), (name, path, kind)
        else:
            assert_untouched(before, snapshot(work))

    run()


STABILITY = ("-q", "--triplets", "2", "--resamples", "20", "--device", "cpu")


def test_field_mutations_through_stability(sources: dict[str, Path], field_paths: Any, tmp_path: Path) -> None:
    baseline = {}
    for name in ("gru", "paper-s4d"):
        outcome = invoke(["stability", sources[name], "-o", tmp_path / f"{name}.zarr", *STABILITY])
        assert outcome.rc == 0, outcome.err
        baseline[name] = numbers(tmp_path / f"{name}.zarr")

    @settings(max_examples=20, **FUZZ)
    @given(field_mutations(("gru", "paper-s4d")))
    def run(case: tuple[str, tuple, str]) -> None:
        name, path, kind = case
        work, target, before = staged(tmp_path, sources[name].name, mutate(raw(sources[name]), path, kind))
        outcome = invoke(["stability", target, "-o", work / "s.zarr", *STABILITY])
        count("checkpoint-field-stability")
        assert_clean(outcome, f"{name} {path} {kind}")
        if outcome.rc != 0:
            assert_untouched(before, snapshot(work))
        elif inert(path):
            assert same_numbers(numbers(work / "s.zarr"), baseline[name]), (name, path, kind)

    run()


# ---- property-based: bytes ----------------------------------------------------------------------

def test_byte_mutations_through_accuracy(sources: dict[str, Path], tmp_path: Path) -> None:
    """Truncated files and flipped bytes: a clean error, or (a flip inside weights or ids) a result."""
    @settings(max_examples=40, **FUZZ)
    @given(st.sampled_from(("gru", "paper-gru")), st.sampled_from(("truncate", "flip")), st.floats(0, 1),
           st.integers(1, 8), st.integers(0, 2**32 - 1))
    def run(name: str, how: str, where: float, n: int, seed: int) -> None:
        data = bytearray(sources[name].read_bytes())
        at = int(where * (len(data) - 1))
        if how == "truncate":
            data = data[:at]
        else:
            rng = np.random.default_rng(seed)
            for i in rng.integers(0, len(data), n):
                data[i] ^= int(rng.integers(1, 256))
        work, target, before = staged(tmp_path, sources[name].name, bytes(data))
        outcome = invoke(["accuracy", target, "-o", work / "a.zarr", "-q", "--device", "cpu"])
        count("checkpoint-bytes")
        assert_clean(outcome, f"{name} {how} {at}")
        if outcome.rc != 0:
            assert_untouched(before, snapshot(work))

    run()
