"""A run directory as `report` reads it (``store.inputs.load_run``, through the run-file readers): its
config.json, metrics.jsonl and eval.json mutated or malformed end in exit 0 (a log cut short reads as a
prefix of itself) or in one `error:` line, exit 2; never a traceback, never a file changed or left
behind. The run comes from tests/store/conftest.py. Also: the labels inputs are shown by, naming what
differs between their configurations.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from tests.helpers.fuzzkit import count, invoke
from tests.helpers.storefuzz import HOSTILE_TEXT, JSON, SETTINGS, judge, refused, replace_by as _replace_by
from tests.helpers.storekit import FAST, snapshot
from gradscope.models import CORES
from gradscope.store.inputs import config_labels, load_inputs, load_run, model_label, pe_label
from tests.helpers.runs import DEFAULT_CORE, OTHER_CORE


RUN_FILES = ("config.json", "metrics.jsonl", "eval.json")


@settings(max_examples=20, **SETTINGS)
@given(data=st.data())
def test_mutated_run_files_through_report(made: dict[str, Path], baseline: dict[str, Any],
                                          data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(made["run"], run)
        name = data.draw(st.sampled_from(RUN_FILES))
        path = run / name
        op = data.draw(st.sampled_from(["json", "bytes", "truncate", "append-line", "edit-field", "replace"]))
        if op == "json":
            path.write_text(json.dumps(data.draw(JSON)))
        elif op == "bytes":
            path.write_bytes(data.draw(st.binary(max_size=40) | st.sampled_from([b"\xff\xfe", b"[" * 100_000])))
        elif op == "truncate":
            raw = path.read_bytes()
            path.write_bytes(raw[:data.draw(st.integers(0, len(raw)))])
        elif op == "append-line":
            with open(path, "ab") as fh:
                fh.write(json.dumps(data.draw(JSON)).encode() + b"\n")
        elif op == "edit-field":  # one field, at the top or (config.json) inside the model/task/train configs
            lines = path.read_text().splitlines() if name == "metrics.jsonl" else [path.read_text()]
            doc = json.loads(lines[0])
            part = doc["config"][data.draw(st.sampled_from(["model", "task", "train"]))] \
                if name == "config.json" and data.draw(st.booleans()) else doc
            key = data.draw(st.sampled_from(sorted(part)))
            part[key] = data.draw(JSON | HOSTILE_TEXT)
            lines[0] = json.dumps(doc)
            path.write_text("\n".join(lines) + "\n")
        else:
            _replace_by(data, path, run)
        before = snapshot(tmp)
        outcome = invoke(["report", run, "-o", Path(tmp) / "r.html", *FAST])
        count(f"run files via report (exit {outcome.rc})")
        judge(outcome, f"{name}: {op}", before, snapshot(tmp), ("r.html",))
        if outcome.rc == 0 and name == "metrics.jsonl" and op == "truncate":  # a log cut short: a prefix of it
            logged = [json.dumps(r, sort_keys=True) for r in baseline["run"].metrics]
            assert all(json.dumps(r, sort_keys=True) in logged for r in load_run(run).metrics)


MALFORMED_RUN_FILES = [
    ("config.json", b"\xff\xfe{}", "not UTF-8"),
    ("config.json", b"[1, 2]", "not a gradscope run config"),
    ("config.json", b'{"format": "gradscope-run", "config": {"model": [], "task": {}, "train": {}}}', "config"),
    ("config.json", b'{"format": "gradscope-run", "config": {"train": {"seed": "x"}}}', "seed"),
    ("config.json", b"[" * 100_000, "JSON"),
    ("metrics.jsonl", b'{"iteration": 5, "loss": 1.0}\n[1, 2]\n', "metrics.jsonl line 2"),
    ("metrics.jsonl", b'{"iteration": "5"}\n', "metrics.jsonl line 1"),
    ("metrics.jsonl", b"\xff\n", "not UTF-8"),
    ("eval.json", b"[1]", "evaluation"),
    ("eval.json", b'{"iteration": 10, "uniform": "high"}', "evaluation"),
]


@pytest.mark.parametrize("name,content,needle", MALFORMED_RUN_FILES)
def test_malformed_run_files_give_one_line(mine: dict[str, Path], tmp_path: Path, name: str, content: bytes,
                                           needle: str) -> None:
    """Caught before the fix: config.json not UTF-8 → UnicodeDecodeError; a list line in metrics.jsonl or
    a list in eval.json → TypeError (all exit 1, with a traceback)."""
    (mine["run"] / name).write_bytes(content)
    refused(["report", mine["run"], "-o", tmp_path / "r.html"], needle)
    count("run-file cases")


def test_a_metrics_line_cut_short_is_skipped(mine: dict[str, Path], tmp_path: Path) -> None:
    with open(mine["run"] / "metrics.jsonl", "a") as fh:
        fh.write('{"iteration": 15, "lo')
    assert invoke(["report", mine["run"], "-o", tmp_path / "r.html"]).rc == 0


# ---- labels ------------------------------------------------------------------------------------------

def test_labels_say_vanilla_or_pe_and_what_differs(trained_runs: dict) -> None:
    assert pe_label("none") == "vanilla" and pe_label("learnable") == "PE (learnable)"
    assert model_label({"core": "s4d", "pe": "sinusoidal"}) == "S4D PE (sinusoidal)"
    items = load_inputs([trained_runs["dual"], trained_runs["uniform"], trained_runs["other"]])
    labels = [i.label for i in items]
    first, other = CORES[DEFAULT_CORE].label, CORES[OTHER_CORE].label
    assert labels == [f"{first} vanilla · 30 it, dual", f"{first} vanilla · 10 it, uniform", f"{other} PE (sinusoidal)"]
    assert items[0].detail.startswith(f"{first} vanilla [iterations=30, distribution=dual, ")  # every differing field


def _config(core: str = "gru", pe: str = "none", K: int = 64, L: int = 16, iterations: int = 6000,
            every: int = 1500, max_len: int = 32, lr: float = 3e-3) -> tuple[dict, dict, dict]:
    return ({"core": core, "pe": pe, "max_len": max_len, "hidden_size": 128},
            {"name": "reverse", "vocab_size": K, "length": L, "distribution": "dual"},
            {"iterations": iterations, "checkpoint_every": every, "lr": lr, "seed": 1, "threads": 1})


def test_short_labels_name_what_differs_and_leave_bookkeeping_out() -> None:
    """The shipped 6k and 60k GRUs differ in iterations, checkpoint_every and max_len: the short label
    names the iterations only, the full one all three; LSTM, alone, is core and PE."""
    configs = [_config(), _config(pe="sinusoidal"), _config(iterations=60000, every=5000, max_len=128),
               _config(pe="sinusoidal", iterations=60000, every=5000, max_len=128), _config("lstm")]
    got = config_labels(configs)
    assert [short for short, _ in got] == ["GRU vanilla · 6k it", "GRU PE (sinusoidal) · 6k it",
                                          "GRU vanilla · 60k it", "GRU PE (sinusoidal) · 60k it", "LSTM vanilla"]
    assert got[2][1] == "GRU vanilla [iterations=60000, checkpoint_every=5000, max_len=128]"
    assert all(len(short) <= 30 for short, _ in got)
    # a K × L grid needs both fields; lr changing with iterations adds one field, never more than two
    grid = config_labels([_config(K=k, L=n) for k in (32, 64) for n in (8, 16)])
    assert [short for short, _ in grid] == ["GRU vanilla · K=32, L=8", "GRU vanilla · K=32, L=16",
                                            "GRU vanilla · K=64, L=8", "GRU vanilla · K=64, L=16"]
    three = config_labels([_config(K=32, iterations=1000, lr=1e-3), _config(K=64, iterations=2000, lr=2e-3)])
    assert [short for short, _ in three] == ["GRU vanilla · 1k it, K=32", "GRU vanilla · 2k it, K=64"]
    # configurations told apart only by bookkeeping still get distinct labels
    books = config_labels([_config(every=100), _config(every=200)])
    assert books[0][0] != books[1][0] and "checkpoint_every=100" in books[0][0]
