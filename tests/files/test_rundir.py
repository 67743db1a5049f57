"""Resuming a run (``files.rundir``: the resume state, config.json, metrics.jsonl and eval.json are checked
before any step): a malformed run is refused in one line and left as it was; a mutation the resume does
not read, or a log line past the checkpoint, resumes to the very weights of the unmutated run. The
checkpoints and the stopped run come from tests/files/conftest.py. Also: the command a run records is
written relative to its directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from hypothesis import given, settings, strategies as st

from tests.helpers.fuzzkit import assert_clean, assert_untouched, count, invoke, snapshot
from tests.helpers.hardening import (FIELD_PATHS, FUZZ, KINDS, copy_run, inert, mutate, paths, raw,
                                     refused_untouched as refused)
from gradscope.files.rundir import relative_command


# ---- a malformed run is refused on resume ---------------------------------------------------------

def _ckpt(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        c = raw(run / "step-0000010.pt")
        change(c)
        torch.save(c, run / "step-0000010.pt")
    return apply


def _config(change: Callable[[str], bytes]) -> Callable[[Path], None]:
    return lambda run: (run / "config.json").write_bytes(change((run / "config.json").read_text()))


def _group(c: dict, key: str, value: Any) -> None:
    c["optimizer"]["param_groups"][0][key] = value


RESUME_CASES: dict[str, Callable[[Path], None]] = {
    "no optimizer": _ckpt(lambda c: c.pop("optimizer")),
    "no rng": _ckpt(lambda c: c.pop("rng")),
    "no log_window": _ckpt(lambda c: c.pop("log_window")),
    "rng state of the wrong size": _ckpt(lambda c: c["rng"].update(data=torch.zeros(10, dtype=torch.uint8))),
    "torch rng state of the wrong size": _ckpt(lambda c: c["rng"].update(torch=torch.zeros(7, dtype=torch.uint8))),
    "rng state a float tensor": _ckpt(lambda c: c["rng"].update(data=c["rng"]["data"].float())),
    "rng state a string": _ckpt(lambda c: c["rng"].update(data="x")),
    "rng device unknown": _ckpt(lambda c: c["rng"].update(data_device="bogus")),
    "rng device a number": _ckpt(lambda c: c["rng"].update(data_device=3)),
    "optimizer moment of the wrong shape": _ckpt(lambda c: c["optimizer"]["state"][1].update(exp_avg=torch.zeros(3))),
    "optimizer moment sparse": _ckpt(lambda c: c["optimizer"]["state"][1].update(
        exp_avg_sq=c["optimizer"]["state"][1]["exp_avg_sq"].to_sparse())),
    "optimizer step NaN": _ckpt(lambda c: c["optimizer"]["state"][0].update(step=torch.tensor(float("nan")))),
    "optimizer step negative": _ckpt(lambda c: c["optimizer"]["state"][0].update(step=torch.tensor(-4.0))),
    "optimizer state for a parameter that does not exist": _ckpt(lambda c: c["optimizer"]["state"].update(
        {99: c["optimizer"]["state"][0]})),
    "optimizer state a list": _ckpt(lambda c: c["optimizer"].update(state=[1])),
    "optimizer params renumbered": _ckpt(lambda c: _group(c, "params", [0, 1])),
    "optimizer betas a string": _ckpt(lambda c: _group(c, "betas", "x")),
    "optimizer eps NaN": _ckpt(lambda c: _group(c, "eps", float("nan"))),
    "optimizer amsgrad switched on": _ckpt(lambda c: _group(c, "amsgrad", True)),
    "log window of the wrong shape": _ckpt(lambda c: c["log_window"].update(sums=torch.zeros(5))),
    "log window steps a string": _ckpt(lambda c: c["log_window"].update(steps="3")),
    "log window steps 1e30": _ckpt(lambda c: c["log_window"].update(steps=1e30)),
    "metrics a list": _ckpt(lambda c: c.update(metrics=[1])),
    "metrics loss a string": _ckpt(lambda c: c["metrics"].update(loss="x")),
    "a stripped checkpoint": _ckpt(lambda c: c.update(stripped=True)),
    "iteration past the end": _ckpt(lambda c: c.update(iteration=10**6)),
    "config.json a list": _config(lambda t: b"[1, 2]"),
    "config.json not UTF-8": _config(lambda t: b"\xff" + t.encode()),
    "config.json not JSON": _config(lambda t: t[:20].encode()),
    "config.json disagrees with the checkpoint": _config(
        lambda t: t.replace('"hidden_size": 16', '"hidden_size": 24').encode()),
    "config.json seed out of range": _config(lambda t: t.replace('"seed": 7', '"seed": -1').encode()),
    "config.json config a string": _config(lambda t: json.dumps({**json.loads(t), "config": "x"}).encode()),
    "metrics.jsonl not UTF-8": lambda run: (run / "metrics.jsonl").write_bytes(b"\xff\n"),
    "metrics.jsonl a list line": lambda run: (run / "metrics.jsonl").write_text("[1]\n" + (run / "metrics.jsonl").read_text()),
    "metrics.jsonl iteration a string": lambda run: (run / "metrics.jsonl").write_text(
        '{"iteration": "5", "loss": 1.0}\n{"iteration": "10", "loss": 1.0}\n'),
    "metrics.jsonl missing": lambda run: (run / "metrics.jsonl").unlink(),
    "eval.json of the wrong shape": lambda run: (run / "eval.json").write_text("[1]\n"),
    "eval.json not UTF-8": lambda run: (run / "eval.json").write_bytes(b"\xff{}"),
}


@pytest.mark.parametrize("case", RESUME_CASES)
def test_a_malformed_run_is_refused_on_resume(case: str, stopped: Path, tmp_path: Path) -> None:
    run = copy_run(stopped, tmp_path / "run")
    RESUME_CASES[case](run)
    refused(["train", "--resume", run, "-q"], tmp_path, case)
    count("resume-named")


def test_the_unmutated_run_resumes(stopped: Path, tmp_path: Path) -> None:
    run = copy_run(stopped, tmp_path / "run")
    outcome = invoke(["train", "--resume", run, "-q"])
    assert outcome.rc == 0, outcome.err
    assert raw(run / "step-0000012.pt")["iteration"] == 12


# ---- property-based: every field of the checkpoint and of the run files ---------------------------

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


# ---- the recorded command ------------------------------------------------------------------------

def test_training_records_its_command_relative_to_the_run_directory(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "gru-none-s1"
    assert relative_command(f"gradscope train --model gru -o {run}", run) == "gradscope train --model gru -o ."
    assert relative_command("gradscope train -o runs/a --resume runs/a", Path("runs/a"), tmp_path) == \
        "gradscope train -o . --resume ."
    assert relative_command(f"gradscope train --init {tmp_path}/other/x.pt -o out", Path("out"), tmp_path) == \
        "gradscope train --init x.pt -o ."
    assert relative_command("gradscope reproduce -o study", Path("study/runs/a"), tmp_path) == \
        "gradscope reproduce -o study"
