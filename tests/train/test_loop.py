"""The training loop (``train.loop``): a resumed run equals the uninterrupted one in every field, after a
stop, a kill -9 in the middle of a checkpoint, a full disk, or (an lm run on a corpus) kills at random
moments; bad options and an output that is a file are refused in one line before anything is
allocated, leaving the run directory exactly as it was.
"""

from __future__ import annotations

import dataclasses
import json
import random
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.faultkit import spawn, temporaries
from tests.helpers.fuzzkit import count, invoke, leftovers
from tests.helpers.hardening import TRAIN, corpus_base, raw, run_differences, warm
from tests.helpers.hardening import refused_untouched as refused
from tests.helpers.hardening import succeeded as _ok
from tests.helpers.runs import small_run
from gradscope.train import train


def same(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two checkpoint values differ (tensors bit for bit, NaN equal to NaN)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dtype != b.dtype or a.shape != b.shape:
            return [where]
        if a.is_floating_point():
            ok = torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.5), b.nan_to_num(0.5))
        else:
            # bit for bit: resume on the same machine and code path
            ok = torch.equal(a, b)
        return [] if ok else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where} keys {sorted(map(str, a.keys() ^ b.keys()))}"]
        return [d for k in a for d in same(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return [where]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in same(x, y, f"{where}[{i}]")]
    return [] if type(a) is type(b) and a == b else [where]


# ---- exact resume, kill -9 leftovers ----------------------------------------------------------------

def test_a_resumed_checkpoint_equals_the_uninterrupted_one_in_every_field(tmp_path: Path) -> None:
    """0→10 in one go, and 0→9, stop, 9→10: every checkpoint they share is the same in every field
    (the stop at 9 falls between log lines, so the resumed run must carry the last log's metrics)."""
    cfg = small_run(iterations=20)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, log_every=4, checkpoint_every=5))
    train(cfg, tmp_path / "whole", stop_after=10)
    train(cfg, tmp_path / "split", stop_after=9)
    train(cfg, tmp_path / "split", resume=True, stop_after=1)
    for name in ("step-0000005.pt", "step-0000010.pt"):
        diff = same(raw(tmp_path / "whole" / name), raw(tmp_path / "split" / name), name)
        assert not diff, diff
    strip = lambda p: [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}  # noqa: E731
                       for line in (p / "metrics.jsonl").read_text().splitlines()]
    assert strip(tmp_path / "whole") == strip(tmp_path / "split")
    # and on to the end: eval.json and the final checkpoint too
    train(cfg, tmp_path / "whole", resume=True)
    train(cfg, tmp_path / "split", resume=True)
    assert not same(raw(tmp_path / "whole" / "step-0000020.pt"), raw(tmp_path / "split" / "step-0000020.pt"))
    assert (tmp_path / "whole" / "eval.json").read_text() == (tmp_path / "split" / "eval.json").read_text()


KILL_MID_WRITE = textwrap.dedent("""
    import os, signal, sys, torch
    real = torch.save
    def save(obj, f, *a, **k):
        if ".step-0000010.pt." in str(getattr(f, "name", f)):
            f.write(b"partial checkpoint") if hasattr(f, "write") else open(f, "wb").write(b"partial checkpoint")
            f.flush() if hasattr(f, "flush") else None
            os.kill(os.getpid(), signal.SIGKILL)
        return real(obj, f, *a, **k)
    torch.save = save
    from gradscope.cli.app import main
    sys.argv = ["gradscope", *sys.argv[1:]]
    main()
""")


def test_kill_minus_9_mid_checkpoint_then_resume_leaves_nothing_and_ends_the_same(tmp_path: Path) -> None:
    args = ["--vocab-size", "8", "--length", "4", "--hidden-size", "16", "--embed-size", "8", "--iterations", "12",
            "--checkpoint-every", "5", "--log-every", "5", "--batch-size", "16", "--seed", "3", "--threads", "1",
            "--heldout-size", "64", "--grid-per-cell", "2", "-q"]
    victim = subprocess.run([sys.executable, "-c", KILL_MID_WRITE, "train", "-o", str(tmp_path / "killed"), *args],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert victim.returncode == -9, victim.stderr
    assert list((tmp_path / "killed").glob(".step-0000010.pt.*.tmp")), "the kill did not land mid-write"
    assert invoke(["train", "--resume", tmp_path / "killed", "-q"]).rc == 0
    assert invoke(["train", "-o", tmp_path / "whole", *args]).rc == 0
    assert not leftovers(tmp_path / "killed")
    for name in ("step-0000010.pt", "step-0000012.pt"):
        assert not same(raw(tmp_path / "whole" / name), raw(tmp_path / "killed" / name), name)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus ``a`` (and ``b``, and a 3-iteration lm run on ``a``): the corpus an lm run trains on."""
    return corpus_base(tmp_path_factory)


def test_lm_training_killed_then_resumed_equals_the_uninterrupted_run(base: Path, tmp_path: Path) -> None:
    warm()
    train = [*TRAIN, "--corpus", base / "a", "--iterations", "24", "--checkpoint-every", "4", "--log-every", "2",
             "--seed", "5"]
    logs = tmp_path / "logs"
    (tmp_path / "ref").mkdir()
    _ok(spawn([*train, "-o", "run"], cwd=tmp_path / "ref", logs=logs).outcome(180), "uninterrupted lm run")
    run = tmp_path / "run"
    child = spawn([*train, "-o", "run"], cwd=tmp_path, logs=logs)
    deadline = time.monotonic() + 120
    while not list(run.glob("step-0000008.pt")) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    child.kill()
    assert child.status == -9, "the lm run ended before the kill"
    for _ in range(2):  # resumes, killed a random moment later
        child = spawn(["train", "--resume", "run", "-q"], cwd=tmp_path, logs=logs)
        time.sleep(random.Random(len(list(run.glob("step-*.pt")))).uniform(0.2, 1.0))
        child.kill()
    _ok(spawn(["train", "--resume", "run", "-q"], cwd=tmp_path, logs=logs).outcome(180), "final resume")
    problems = run_differences(tmp_path / "ref" / "run", run)
    assert not problems, "\n".join(problems[:12])
    assert not temporaries(run)


# ---- options and outputs refused before anything is allocated ----------------------------------------

def test_train_out_an_existing_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("mine")
    err = refused(["train", "-o", tmp_path / "file", "-q", "--iterations", "2"], tmp_path)
    assert "file" in err
    refused(["train", "-o", tmp_path / "file" / "below", "-q", "--iterations", "2"], tmp_path)


BAD_OPTIONS = [
    ["--device", "meta"], ["--device", "xpu"], ["--device", "cuda:7"], ["--device", "bogus"], ["--device", "cpu:x"],
    ["--seed", "-1"], ["--seed", str(2**64)], ["--seed", str(2**63)],
    ["--batch-size", "1000000000"], ["--batch-size", "1e9"], ["--vocab-size", "1000000000"], ["--hidden-size", "100000"],
    ["--embed-size", "100000000"], ["--num-layers", "100000"], ["--length", "1000000"], ["--heldout-size", "1000000000"],
    ["--pe", "learnable", "--max-len", "1000000000"], ["--threads", "-1"], ["--lr", "nan"], ["--lr", "inf"],
    ["--clip", "nan"], ["--rarity", "nan"], ["--eps", "inf"], ["--beta1", "nan"], ["--iterations", "1e30"],
    ["--stop-after", "-3"],
]


@pytest.mark.parametrize("args", BAD_OPTIONS, ids=" ".join)
def test_bad_train_options_are_one_line_before_anything_is_allocated(args: list[str], tmp_path: Path) -> None:
    start, peak = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused(["train", "-o", tmp_path / "r", "-q", "--iterations", "3", *args], tmp_path, " ".join(args))
    assert time.perf_counter() - start < 20
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 500_000  # kB
    count("train-options")


# ---- a full disk ------------------------------------------------------------------------------------

LIMITED = textwrap.dedent("""
    import resource, sys
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    from gradscope.cli.app import main
    sys.argv = ["gradscope", *sys.argv[2:]]
    main()
""")


def test_a_file_size_limit_mid_checkpoint_is_one_line_and_resume_continues_exactly(tmp_path: Path) -> None:
    cfg = small_run(iterations=12)
    train(cfg, tmp_path / "whole")
    run = tmp_path / "run"
    train(cfg, run, stop_after=5)
    first = (run / "step-0000005.pt").read_bytes()
    limit = len(first) // 2  # the log and config fit; a checkpoint does not
    proc = subprocess.run([sys.executable, "-c", LIMITED, str(limit), "train", "--resume", str(run), "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and "step-0000010.pt" in proc.stderr
    assert (run / "step-0000005.pt").read_bytes() == first and not (run / "step-0000010.pt").exists()
    assert not leftovers(run)
    assert invoke(["train", "--resume", run, "-q"]).rc == 0
    assert not same(raw(tmp_path / "whole" / "step-0000012.pt"), raw(run / "step-0000012.pt"))
    assert (tmp_path / "whole" / "eval.json").read_text() == (run / "eval.json").read_text()
