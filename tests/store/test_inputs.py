"""A run directory as `report` reads it (``store.inputs.load_run``, through the run-file readers): its
config.json, metrics.jsonl and eval.json mutated or malformed end in exit 0 (a log cut short reads as a
prefix of itself) or in one `error:` line, exit 2; never a traceback, never a file changed or left
behind. The run comes from tests/store/conftest.py.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.fuzzkit import count, invoke
from tests.helpers.storefuzz import HOSTILE_TEXT, JSON, SETTINGS, judge, refused
from tests.helpers.storefuzz import replace_by as _replace_by  # the name in the fuzz test's source, whose examples it seeds
from tests.helpers.storekit import FAST, snapshot
from gradscope.store.inputs import load_run


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
