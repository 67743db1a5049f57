"""Builders and checks that the hardening tests of several packages share: small real checkpoints and
runs (to mutate), checkpoint mutations, the comparison of a resumed run with an uninterrupted one, the
children's warm start, tiny library models and small prepared corpora.

Not a test module. Fixtures stay in the test modules (or their package's conftest.py), each a line
that calls a builder here; what is used by one test module only stays in that module.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck
from torch import nn

from tests.helpers.fuzzkit import Outcome, assert_clean, assert_untouched, invoke, snapshot
from tests.helpers.runs import COMPLEX_CORE, DEFAULT_CORE, OTHER_CORE, small_run

ROOT = Path(__file__).resolve().parents[2]
FUZZ = dict(derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))  # hypothesis settings


def raw(path: Path) -> dict[str, Any]:
    """A checkpoint file as saved (plain data, on the CPU)."""
    return torch.load(path, map_location="cpu", weights_only=True)


# ---- a resumed run against the uninterrupted one --------------------------------------------------

WALL_CLOCK_METRICS = {"tokens_per_s"}  # metrics.jsonl fields that measure time, not training


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two checkpoint objects differ (exact: tensors bitwise, with dtype and shape; NaN = NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in sorted(set(a) | set(b), key=str):
            if key not in b:
                found.append(f"{where}[{key!r}]: missing in the resumed run (uninterrupted: {str(a[key])[:80]})")
            elif key not in a:
                found.append(f"{where}[{key!r}]: only in the resumed run ({str(b[key])[:80]})")
            else:
                found += differences(a[key], b[key], f"{where}[{key!r}]")
        return found
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return [f"{where}: {str(a)[:80]} != {str(b)[:80]}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return [f"{where}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"]
        same = a.eq(b) | (a.isnan() & b.isnan()) if a.is_floating_point() else a.eq(b)
        return [] if bool(same.all()) else [f"{where}: tensors differ in {int((~same).sum())} of {a.numel()} entries"]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if type(a) is type(b) and a == b else [f"{where}: {a!r} != {b!r}"]


def checkpoint_names(run: Path) -> list[str]:
    return sorted(p.name for p in run.glob("step-*.pt"))


def run_differences(ref: Path, run: Path) -> list[str]:
    """How ``run`` differs from the uninterrupted ``ref``: its checkpoints, field by field, its
    metrics log (less wall-clock fields), its held-out evaluation and its config."""
    found = []
    if checkpoint_names(ref) != checkpoint_names(run):
        found.append(f"checkpoints {checkpoint_names(run)} != uninterrupted {checkpoint_names(ref)}")
    for name in sorted(set(checkpoint_names(ref)) & set(checkpoint_names(run))):
        found += [f"{name}{d}" for d in differences(raw(ref / name), raw(run / name))]
    if metrics(ref) != metrics(run):
        found.append(f"metrics.jsonl: {metrics(run)} != uninterrupted {metrics(ref)}")
    for name in ("eval.json", "config.json"):
        a, b = ref / name, run / name
        if not b.is_file() or json.loads(a.read_text()) != json.loads(b.read_text()):
            found.append(f"{name}: {b.read_text()[:200] if b.is_file() else 'missing'} != {a.read_text()[:200]}")
    return found


def metrics(run: Path) -> list[dict[str, Any]]:
    """The complete lines of a metrics log, less wall-clock fields (a line cut by a kill is skipped)."""
    lines = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            lines.append({k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK_METRICS})
        except json.JSONDecodeError:
            pass
    return lines


def warm() -> None:
    """Import in this process what the children use, so each starts in milliseconds."""
    import gradscope.cli.app  # noqa: F401
    import gradscope.cli.report  # noqa: F401
    import gradscope.cli.stability  # noqa: F401
    import gradscope.cli.summarize  # noqa: F401
    import gradscope.cli.train  # noqa: F401
    import gradscope.reports  # noqa: F401
    import gradscope.store.inputs  # noqa: F401
    import gradscope.store.io  # noqa: F401
    import gradscope.store.summary  # noqa: F401
    import gradscope.workflows.stability  # noqa: F401
    import gradscope.workflows.summarize  # noqa: F401
    import gradscope.workflows.sweep.grid  # noqa: F401
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # Adam imports torch._dynamo (~4 s) on first use


# ---- small trained checkpoints and runs --------------------------------------------------------------

def small_checkpoint(tmp_path_factory: pytest.TempPathFactory, core: str) -> Path:
    """A small trained checkpoint of ``core`` (vocabulary 8, L = 4), trained once per session and
    shared by the hardening suites."""
    from gradscope.train import train
    run = tmp_path_factory.getbasetemp() / "hardening-runs" / core
    if not (run / "eval.json").exists():
        train(small_run(core, iterations=5), run)
    return run / "step-0000005.pt"


def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 12 iterations stopped at 10 (checkpoints at 5 and 10, log lines at 5 and 10)."""
    from gradscope.train import train
    run = tmp_path_factory.mktemp("stopped") / "run"
    train(small_run(iterations=12), run, stop_after=10)
    return run


def copy_run(src: Path, dst: Path) -> Path:
    import shutil
    shutil.copytree(src, dst)
    return dst


def refused_untouched(args: list[Any], root: Path, context: str = "") -> str:
    """``gradscope ARGS`` ends in exit 2 with one ``error:`` line and leaves ``root`` as it was; its stderr."""
    before = snapshot(root)
    outcome = invoke(args)
    assert_clean(outcome, context)
    assert outcome.rc == 2, f"{context}: exit {outcome.rc}"
    assert_untouched(before, snapshot(root))
    return outcome.err


K, L = 8, 4  # the small checkpoints' vocabulary and probe length
FAST = ("-q", "--resamples", "2")
BUDGET = str(256 << 20)  # a small memory budget: large option values are refused, never run


def input_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small trained checkpoints of two registered cores, "first" (the default) and "other" (a second
    gated core), vocabulary 8, L = 4, and a factory's LM checkpoint."""
    base = tmp_path_factory.mktemp("inputs")
    out = {"first": small_checkpoint(tmp_path_factory, DEFAULT_CORE), "other": small_checkpoint(tmp_path_factory, OTHER_CORE)}
    sys.path.insert(0, str(ROOT / "docs" / "examples"))
    try:
        from lstm_lm_factory import LanguageModel
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    torch.save(LanguageModel().state_dict(), base / "lm.pt")  # vocabulary 12
    out["lm"] = base / "lm.pt"
    return out


class Work:
    """A fresh working directory per example, inside a parent whose contents are watched."""

    def __init__(self, root: Path) -> None:
        self.root, self.n = root, 0

    def new(self) -> Path:
        self.n += 1
        d = self.root / f"w{self.n}"
        d.mkdir()
        return d


# ---- checkpoints to mutate, and their mutations ---------------------------------------------------

DELETE = object()


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


def checkpoint_sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name → checkpoint file. ``gru`` lies in a run directory stopped at 10 of 12 iterations."""
    from gradscope.train import train
    base = tmp_path_factory.mktemp("sources")
    train(small_run(iterations=12), base / "gru", stop_after=10)
    train(small_run(COMPLEX_CORE, pe="sinusoidal", iterations=5), base / "s4d")
    (base / "paper").mkdir()
    return {"gru": base / "gru" / "step-0000010.pt", "s4d": base / "s4d" / "step-0000005.pt",
            "paper-gru": paper_gru(base / "paper" / "checkpoint_after-100-iters.pt"),
            "paper-s4d": paper_s4d(base / "paper" / "checkpoint_after-5-iters.pt")}


def paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into the nested dicts, lists and tuples of a checkpoint (inner nodes too)."""
    found: list[tuple] = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) and \
        len(obj) <= 16 else ()
    for key, value in items:
        found.append((*prefix, key))
        found.extend(paths(value, (*prefix, key)))
    return found


FIELD_PATHS: dict[str, list[tuple]] = {}  # source name → paths(its checkpoint), filled by record_field_paths


def record_field_paths(sources: dict[str, Path]) -> dict[str, list[tuple]]:
    """Fill FIELD_PATHS from the sources (the hypothesis strategies draw from it)."""
    FIELD_PATHS.update({name: paths(raw(path)) for name, path in sources.items()})
    return FIELD_PATHS


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


# ---- tiny library models ------------------------------------------------------------------------------

V = 20  # the tiny library models' vocabulary


def tiny_mamba() -> torch.nn.Module:
    """A tiny transformers Mamba language model (skips the test where transformers is not installed)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=V, hidden_size=8, state_size=4, num_hidden_layers=2, expand=2,
                                   conv_kernel=3, time_step_rank=2, use_bias=True)
    return transformers.MambaForCausalLM(cfg).eval()


def refused_one_line(result, *words: str) -> None:  # noqa: ANN001
    """A CliRunner result that is exit 2 with one ``error:`` line (``warning:`` lines aside) holding every word."""
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    lines = [ln for ln in result.stderr.strip().splitlines() if not ln.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


# ---- small prepared corpora ---------------------------------------------------------------------------

WORDS = ("the cat sat on a mat and dog ran to big red house with blue door under tree old man saw small bird in "
         "green field quick fox jumps over lazy river bank").split()
TRAIN = ["train", "--task", "lm", "--core", "lstm", "--embed-size", "8", "--hidden-size", "8", "--max-length", "12",
         "--batch-size", "4", "--warmup", "1", "--heldout-size", "4", "--threads", "1", "-q"]


def write_text(path: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(WORDS) + 1)
    lines = [" = Title = ", ""] + [" ".join(rng.choice(WORDS, int(rng.integers(4, 30)), p=p / p.sum()))
                                  for _ in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def one_line(r, words: str = "") -> None:  # noqa: ANN001
    """Exit 2 with one `error:` line holding ``words``; no traceback."""
    assert r.exit_code == 2, f"exit {r.exit_code}: {r.stdout[-400:]} {r.stderr[-1500:]} {r.exception!r}"
    assert r.stderr.startswith("error:") and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    # the CLI names its flags (--model-type), the library its parameters (model_type)
    assert words in r.stderr or (words.isidentifier() and f"--{words.replace('_', '-')}" in r.stderr), r.stderr


def corpus_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus ``a``, a second corpus ``b`` of other text with the same vocabulary size, and a
    3-iteration lm run on ``a``."""
    from typer.testing import CliRunner

    from gradscope.cli.app import app
    from gradscope.workflows.corpus import CorpusOptions, prepare_corpus
    root = tmp_path_factory.mktemp("hcorpus")
    settings = CorpusOptions(vocab_size=40, valid=0.15, test=0.15)
    prepare_corpus(write_text(root / "a.txt", 160, 0), root / "a", opts=settings)
    prepare_corpus(write_text(root / "b.txt", 160, 1), root / "b", opts=settings)
    r = CliRunner().invoke(app, [*TRAIN, "--corpus", str(root / "a"), "--iterations", "3", "--checkpoint-every", "3",
                                 "-o", str(root / "run")])
    assert r.exit_code == 0, r.output
    return root


def succeeded(o: Outcome, what: str) -> None:
    """A child's outcome was exit 0."""
    assert o.rc == 0, f"{what}: exit {o.rc}: {o.err[-1500:]}"
