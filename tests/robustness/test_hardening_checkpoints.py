"""Checkpoint and run-file hardening (issue #15, classes 1, 2, 5, 6 and 7): real checkpoints, mutated.

Small real checkpoints (gradscope format: a GRU run stopped before its end, an S4D run; the paper's
format: a GRU with a uniform held-out set, an S4D with a frequency grid) are mutated field by field
(deleted, replaced by a wrong type, None, NaN, 1e30, -1, a tensor of the wrong shape or dtype, a
sparse, meta or stride-0 tensor, token ids outside the vocabulary), or byte by byte (truncated,
flipped), saved with ``torch.save`` and fed to ``gradscope.load``, ``gradscope accuracy``,
``gradscope stability`` and ``gradscope train --resume``. Each must end in exit 0 — and then, where
the mutation did not touch data the command reads, give exactly the unmutated numbers — or in
exit 2 with one ``error:`` line: never a traceback, never a partial or changed file.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import gradscope
from tests.helpers.runs import COMPLEX_CORE, small_run
from tests.helpers.fuzzkit import assert_clean, assert_untouched, count, invoke, snapshot
from gradscope.errors import GradscopeError
from gradscope.store import read_store
from gradscope.tasks import make_task
from gradscope.train import train
from gradscope.train.evaluate import evaluate_heldout

FUZZ = dict(derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
DELETE = object()


# ---- the sources --------------------------------------------------------------------------------

def paper_gru(path: Path) -> Path:
    """A GRU checkpoint in the paper's layout (uniform held-out set (n, L)), from plain nn modules."""
    torch.manual_seed(3)
    K, E, H, L = 6, 4, 5, 3
    rnn = nn.GRU(2 * E, H, batch_first=True)
    freqs = torch.exp(torch.arange(0, E, 2) * (-math.log(10000.0) / E))
    sd = {"embedding.weight": torch.randn(K + 1, E), "time_encoder.frequencies": freqs,
          **{f"rnn.{k}": v.detach() for k, v in rnn.state_dict().items()},
          "to_logits.weight": torch.randn(K, H), "to_logits.bias": torch.randn(K)}
    torch.save({"modules": {"rnn": {"module_name": "RNN", "state_dict": sd, "init_args": {
        "vocab_size": K, "hidden_size": H, "rnn_name": "GRU", "embed_size": E, "time_encoding": "concat",
        "time_encoding_form": "sinusoidal", "max_length": 2 * L, "num_layers": 1}}},
        "optimizer": {}, "scheduler": {}, "random_seed": 111, "iteration": 99,
        "held_out_data": torch.randint(0, K, (10, L))}, path)
    return path


def paper_s4d(path: Path) -> Path:
    """An S4D checkpoint in the paper's layout, with a frequency grid (2, 2, N, L, L)."""
    from gradscope.config import ModelConfig
    from gradscope.models import SeqModel
    torch.manual_seed(4)
    ours = SeqModel(ModelConfig(core="s4d", vocab_size=6, embed_size=4, hidden_size=5, num_layers=1,
                                core_config={"state_size": 4}))
    sd = {k.replace("core.", "", 1): v.detach() for k, v in ours.state_dict().items()}
    torch.save({"modules": {"ssm": {"module_name": "SSM", "init_args": {"vocab_size": 6}, "state_dict": sd}},
                "random_seed": 1, "iteration": 4, "held_out_data": torch.randint(0, 6, (2, 2, 2, 3, 3))}, path)
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name → checkpoint file. ``gru`` lies in a run directory stopped at 10 of 12 iterations."""
    base = tmp_path_factory.mktemp("sources")
    train(small_run(iterations=12), base / "gru", stop_after=10)
    train(small_run(COMPLEX_CORE, pe="sinusoidal", iterations=5), base / "s4d")
    (base / "paper").mkdir()
    return {"gru": base / "gru" / "step-0000010.pt", "s4d": base / "s4d" / "step-0000005.pt",
            "paper-gru": paper_gru(base / "paper" / "checkpoint_after-100-iters.pt"),
            "paper-s4d": paper_s4d(base / "paper" / "checkpoint_after-5-iters.pt")}


def raw(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


# ---- mutations ----------------------------------------------------------------------------------

def paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into the nested dicts, lists and tuples of a checkpoint (inner nodes too)."""
    found: list[tuple] = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) and \
        len(obj) <= 16 else ()
    for key, value in items:
        found.append((*prefix, key))
        found.extend(paths(value, (*prefix, key)))
    return found


def stride0(value: Any, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    dtype = value.dtype if isinstance(value, torch.Tensor) else torch.long
    if shape is None:
        shape = (10**5, *value.shape[1:]) if isinstance(value, torch.Tensor) and value.dim() else (10**5, 10**4)
    return torch.zeros((), dtype=dtype).expand(shape)


def mutated_value(value: Any, kind: str) -> Any:
    """``value`` spoiled in the way ``kind`` names (DELETE: remove the key)."""
    tensor = isinstance(value, torch.Tensor)
    is_int = tensor and not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
    table = {
        "delete": lambda: DELETE, "none": lambda: None, "string": lambda: "x", "nan": lambda: float("nan"),
        "huge": lambda: 1e30, "negative": lambda: (-value - 1) if is_int else -1, "bool": lambda: True,
        "list": lambda: [1, 2], "dict": lambda: {}, "zero": lambda: torch.zeros_like(value) if tensor else 0,
        "scalar-tensor": lambda: torch.tensor(3), "float-for-int": lambda: 2.5,
        "wrong-shape": lambda: (value.flatten()[:-1] if value.numel() else value.unsqueeze(0)) if tensor
        else torch.zeros(3),
        "wrong-dtype": lambda: (value.double() if is_int else value.long()) if tensor else torch.zeros(2, 2),
        "sparse": lambda: value.to_sparse() if tensor and value.dim() else torch.eye(3).to_sparse(),
        "meta": lambda: value.to("meta") if tensor else torch.empty(3, device="meta"),
        "stride0": lambda: stride0(value),
        "stride0-same-shape": lambda: stride0(value, tuple(value.shape)) if tensor else stride0(value),
        "out-of-vocab": lambda: value + 1000 if tensor else (value + 10**6 if isinstance(value, int) else "oov"),
        "huge-int": lambda: 10**30,
    }
    return table[kind]()


KINDS = ("delete", "none", "string", "nan", "huge", "negative", "bool", "list", "dict", "zero", "scalar-tensor",
         "float-for-int", "wrong-shape", "wrong-dtype", "sparse", "meta", "stride0", "stride0-same-shape",
         "out-of-vocab", "huge-int")


def mutate(obj: Any, path: tuple, kind: str) -> Any:
    """A copy of ``obj`` with the node at ``path`` spoiled (containers on the path copied, nothing else)."""
    if not path:
        return mutated_value(obj, kind)
    key, rest = path[0], path[1:]
    if isinstance(obj, dict):
        out = dict(obj)
        new = mutate(obj[key], rest, kind)
        if new is DELETE:
            out.pop(key)
        else:
            out[key] = new
        return out
    items = list(obj)
    new = mutate(items[key], rest, kind)
    if new is DELETE:
        items.pop(key)
    else:
        items[key] = new
    return type(obj)(items) if isinstance(obj, tuple) else items


# Fields the analysis never reads: an accepted mutation there must leave every number as it was.
ANALYSIS_INERT = ("optimizer", "rng", "scheduler", "log_window", "gradscope_version", "torch_version", "metrics",
                  "random_seed", ("config", "train"))


def inert(path: tuple, fields: tuple = ANALYSIS_INERT) -> bool:
    return any(path[:len(f)] == f if isinstance(f, tuple) else path[0] == f for f in fields)


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


# ---- the cases named in the issue ----------------------------------------------------------------

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


def test_a_huge_config_is_refused_before_anything_is_allocated(sources: dict[str, Path], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """hidden = 28000 with weights that match it: refused for its size against the memory budget."""
    import resource
    path = tmp_path / "big.pt"
    c = raw(sources["gru"])
    c["config"]["model"]["hidden_size"] = 28000
    torch.save(c, path)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(GradscopeError):
        gradscope.load(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000  # kB: nothing like 9 GB
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", "1000")  # the real weights, but less memory than they need
    with pytest.raises(GradscopeError, match="memory"):
        gradscope.load(sources["gru"])


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


FIELD_PATHS: dict[str, list[tuple]] = {}


@pytest.fixture(scope="module")
def field_paths(sources: dict[str, Path]) -> dict[str, list[tuple]]:
    FIELD_PATHS.update({name: paths(raw(path)) for name, path in sources.items()})
    return FIELD_PATHS


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


# ---- property-based: resume -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def resumed(sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The final weights of the unmutated stopped run, resumed to its end."""
    run = tmp_path_factory.mktemp("resumed") / "gru"
    shutil.copytree(sources["gru"].parent, run)
    outcome = invoke(["train", "--resume", run, "-q"])
    assert outcome.rc == 0, outcome.err
    return raw(run / "step-0000012.pt")["model"]


RESUME_INERT = ("gradscope_version", "torch_version", "scheduler")


def _resume(src_run: Path, work: Path, spoil: Any, what: str, final: dict[str, torch.Tensor],
            harmless: bool) -> None:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src_run, work)
    spoil(work)
    before = snapshot(work)
    outcome = invoke(["train", "--resume", work, "-q"])
    assert_clean(outcome, what)
    if outcome.rc == 0:
        weights = raw(work / "step-0000012.pt")["model"]
        if harmless:
            # bit for bit: copies of saved weights
            assert all(torch.equal(weights[k], final[k]) for k in final), what
    else:
        assert_untouched(before, snapshot(work))


def test_field_mutations_through_resume(sources: dict[str, Path], field_paths: Any, resumed: dict,
                                        tmp_path: Path) -> None:
    @settings(max_examples=30, **FUZZ)
    @given(st.sampled_from(FIELD_PATHS["gru"]), st.sampled_from(KINDS))
    def run(path: tuple, kind: str) -> None:
        def spoil(work: Path) -> None:
            torch.save(mutate(raw(work / "step-0000010.pt"), path, kind), work / "step-0000010.pt")
        count("checkpoint-field-resume")
        _resume(sources["gru"].parent, tmp_path / "w", spoil, f"{path} {kind}", resumed, inert(path, RESUME_INERT))

    run()


def _json_mutation(text: str, path: tuple, kind: str) -> str:
    data = json.loads(text)
    value = mutate(data, path, kind) if path else {"list": [1, 2], "string": "x", "none": None}.get(kind, 3)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return json.dumps(mutate(data, path, "delete")) if path else "3"


JSON_KINDS = ("delete", "none", "string", "nan", "huge", "negative", "bool", "list", "dict", "zero", "float-for-int",
              "out-of-vocab", "huge-int")
CONFIG_INERT = (("gradscope_version",), ("command",))


def test_config_json_mutations_through_resume(sources: dict[str, Path], resumed: dict, tmp_path: Path) -> None:
    text = (sources["gru"].parent / "config.json").read_text()
    config_paths = [()] + paths(json.loads(text))

    @settings(max_examples=30, **FUZZ)
    @given(st.sampled_from(config_paths), st.sampled_from(JSON_KINDS + ("not-utf8", "cut")))
    def run(path: tuple, kind: str) -> None:
        def spoil(work: Path) -> None:
            if kind == "not-utf8":
                (work / "config.json").write_bytes(b"\xff\xfe" + text.encode())
            elif kind == "cut":
                (work / "config.json").write_text(text[: len(text) // 2])
            else:
                (work / "config.json").write_text(_json_mutation(text, path, kind))
        count("run-config-json")
        harmless = bool(path) and kind not in ("not-utf8", "cut") and any(path[:len(f)] == f for f in CONFIG_INERT)
        _resume(sources["gru"].parent, tmp_path / "w", spoil, f"config.json {path} {kind}", resumed, harmless)

    run()


METRICS_SPOILS = {
    "not utf-8": lambda lines: [lines[0], "\udcff"] + lines[1:],
    "a list line": lambda lines: lines[:1] + ["[1, 2]"] + lines[1:],
    "a number line": lambda lines: lines[:1] + ["3"] + lines[1:],
    "iteration a string": lambda lines: [json.dumps({**json.loads(lines[0]), "iteration": "5"})] + lines[1:],
    "iteration missing": lambda lines: [json.dumps({"loss": 1.0})] + lines[1:],
    "iteration NaN": lambda lines: ['{"iteration": NaN}'] + lines[1:],
    "garbage line": lambda lines: lines[:1] + ["{not json"] + lines[1:],
    "out of order": lambda lines: lines[::-1],
    "empty": lambda lines: [],
    "cut last line": lambda lines: lines[:-1] + [lines[-1][:7] + "\x00"],
    "a line past the checkpoint": lambda lines: lines + [json.dumps({**json.loads(lines[-1]), "iteration": 11})],
}
HARMLESS_METRICS = ("cut last line", "a line past the checkpoint")


@pytest.mark.parametrize("spoil", METRICS_SPOILS)
def test_metrics_jsonl_mutations_through_resume(spoil: str, sources: dict[str, Path], resumed: dict,
                                                tmp_path: Path) -> None:
    def apply(work: Path) -> None:
        lines = (work / "metrics.jsonl").read_text().splitlines()
        text = "\n".join(METRICS_SPOILS[spoil](lines)) + ("" if spoil == "cut last line" else "\n")
        (work / "metrics.jsonl").write_bytes(text.encode("utf-8", "surrogateescape"))
    count("run-metrics-jsonl")
    _resume(sources["gru"].parent, tmp_path / "w", apply, f"metrics.jsonl {spoil}", resumed, spoil in HARMLESS_METRICS)


@pytest.mark.parametrize("content", [b"\xff\xfe{}", b"[1, 2]", b"{\"iteration\": 3", b"null", b"{\"iteration\": \"x\"}"])
def test_eval_json_mutations_through_resume(content: bytes, sources: dict[str, Path], resumed: dict,
                                            tmp_path: Path) -> None:
    count("run-eval-json")
    _resume(sources["gru"].parent, tmp_path / "w", lambda w: (w / "eval.json").write_bytes(content),
            f"eval.json {content!r}", resumed, False)
