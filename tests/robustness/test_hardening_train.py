"""Training hardening (issue #15, classes 2-6): resume validation, exact resume, kill -9 leftovers,
one writer per run directory, option ranges and resource bombs, and a full disk mid-checkpoint.

Every refusal is exit 2 with one ``error:`` line and leaves the run directory exactly as it was.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from tests.helpers.runs import small_run
from tests.helpers.fuzzkit import assert_clean, assert_untouched, count, invoke, leftovers, snapshot
from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.errors import GradscopeError
from gradscope.train import train
from gradscope.train.device import resolve_device


def raw(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


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


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 12 iterations stopped at 10 (checkpoints at 5 and 10, log lines at 5 and 10)."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    train(small_run(iterations=12), run, stop_after=10)
    return run


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def refused(args: list[Any], root: Path, context: str = "") -> str:
    before = snapshot(root)
    outcome = invoke(args)
    assert_clean(outcome, context)
    assert outcome.rc == 2, f"{context}: exit {outcome.rc}"
    assert_untouched(before, snapshot(root))
    return outcome.err


# ---- class 2: resume validation ---------------------------------------------------------------------

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


# ---- class 3: exact resume, kill -9 leftovers ----------------------------------------------------------

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


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_writers_temporaries_are_removed_by_the_next_run(stopped: Path, tmp_path: Path) -> None:
    from gradscope.files.publish import _HOST
    run = copy_run(stopped, tmp_path / "run")
    pid = dead_pid()
    for name in ("step-0000015.pt", "metrics.jsonl", "eval.json"):
        (run / f".{name}.{_HOST}-{pid}-0123abcd.tmp").write_bytes(b"half a file")
    live = run / f".step-0000020.pt.{_HOST}-{os.getpid()}-0123abcd.tmp"  # a live writer's: kept
    live.write_bytes(b"being written")
    assert invoke(["train", "--resume", run, "-q"]).rc == 0
    assert sorted(p.name for p in run.glob(".*.tmp")) == [live.name]
    live.unlink()


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


# ---- class 4: one writer per run directory ------------------------------------------------------------

def test_a_run_directory_being_trained_is_refused(stopped: Path, tmp_path: Path) -> None:
    from gradscope.files.lock import run_lock
    run = copy_run(stopped, tmp_path / "run")
    with run_lock(run):
        err = refused(["train", "--resume", run, "-q"], tmp_path, "resume while held")
        assert "already being run" in err
        shutil.rmtree(tmp_path / "fresh", ignore_errors=True)
        with run_lock(tmp_path / "fresh"):
            err = refused(["train", "-o", tmp_path / "fresh", "-q", "--iterations", "2"], tmp_path, "fresh while held")
            assert "already being run" in err
    assert invoke(["train", "--resume", run, "-q"]).rc == 0  # released afterwards


def test_a_second_trainer_is_refused_while_another_process_trains_and_a_killed_ones_lock_is_taken_over(
        tmp_path: Path) -> None:
    """A real trainer in another process holds the directory: ``train -o`` and ``train --resume``
    of it are refused in one line and change nothing. Once it is killed (-9), its lock is stale and
    the next run takes it over."""
    from gradscope.files.lock import run_lock_path
    run = tmp_path / "r"
    cmd = [sys.executable, "-c", "from gradscope.cli.app import main; main()", "train", "-o", str(run),
           "--vocab-size", "8", "--length", "4", "--hidden-size", "16", "--embed-size", "8", "--iterations", "1000000",
           "--checkpoint-every", "20", "--batch-size", "16", "--heldout-size", "64", "--grid-per-cell", "2", "-q",
           "--threads", "1"]
    other = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not list(run.glob("step-*.pt")):
            assert other.poll() is None, other.stderr.read() if other.stderr else ""
            assert time.time() < deadline, "no checkpoint within 120 s"
            time.sleep(0.05)
        assert json.loads(run_lock_path(run).read_text())["pid"] == other.pid
        for args in (["train", "-o", run, "-q", "--iterations", "5"], ["train", "--resume", run, "-q"]):
            outcome = invoke(args)
            assert_clean(outcome)
            assert outcome.rc == 2 and "already being run" in outcome.err, outcome.err
    finally:
        other.kill()
        other.wait()
    assert run_lock_path(run).exists()  # left by the killed trainer
    reached = max(int(p.name[5:12]) for p in run.glob("step-*.pt"))
    outcome = invoke(["train", "--resume", run, "-q", "--stop-after", "1"])
    assert outcome.rc == 0, outcome.err
    assert raw(run / f"step-{reached + 1:07d}.pt")["iteration"] == reached + 1
    assert not run_lock_path(run).exists() and not leftovers(run)


def test_train_out_an_existing_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("mine")
    err = refused(["train", "-o", tmp_path / "file", "-q", "--iterations", "2"], tmp_path)
    assert "file" in err
    refused(["train", "-o", tmp_path / "file" / "below", "-q", "--iterations", "2"], tmp_path)


# ---- class 5: options ------------------------------------------------------------------------------------

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


@pytest.mark.parametrize("name", ["meta", "xpu", "bogus", "cuda:99", "cpu:x", ""])
def test_resolve_device_refuses_unusable_devices(name: str, stopped: Path, tmp_path: Path) -> None:
    with pytest.raises(GradscopeError, match="device"):
        resolve_device(name)
    refused(["accuracy", stopped / "step-0000010.pt", "-o", tmp_path / "a.zarr", "-q", "--device", name], tmp_path)
    count("device-options")


@pytest.mark.parametrize("build", [
    lambda: TrainConfig(seed=-1), lambda: TrainConfig(seed=2**63), lambda: TrainConfig(seed=1.5),
    lambda: TrainConfig(batch_size=True), lambda: TrainConfig(lr=float("nan")), lambda: TrainConfig(eps=float("inf")),
    lambda: TrainConfig(betas=(0.9,)), lambda: TrainConfig(betas="ab"), lambda: TrainConfig(device="meta"),
    lambda: TrainConfig(device=3), lambda: TrainConfig(iterations="5"), lambda: TrainConfig(clip=float("nan")),
    lambda: ModelConfig(hidden_size="16"), lambda: ModelConfig(num_layers=10**6), lambda: ModelConfig(core=["gru"]),
    lambda: ModelConfig(pe=None), lambda: TaskConfig(vocab_size="8"), lambda: TaskConfig(rarity="x"),
    lambda: TaskConfig(length=10**9), lambda: TaskConfig(name=["reverse"]), lambda: TaskConfig(hold_max=10**12, name="copy"),
    lambda: RunConfig(model="gru"),
])
def test_configs_refuse_values_out_of_range(build: Callable[[], Any]) -> None:
    with pytest.raises(GradscopeError):
        build()


def test_configs_accept_the_extremes_of_their_ranges() -> None:
    assert TrainConfig(seed=0).seed == 0 and TrainConfig(seed=2**63 - 1).seed == 2**63 - 1
    assert TrainConfig(device="cuda:1").device == "cuda:1"


# ---- class 6: a full disk ------------------------------------------------------------------------------------

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


def test_held_out_sets_that_cannot_be_drawn_are_a_user_error() -> None:
    """A held-out set that the task's distribution cannot fill (or that leaves no training data)
    is a one-line error naming heldout_size, not a RuntimeError."""
    from gradscope.tasks import Batch, Excluder, make_task, sample_excluding, sample_unique
    same_row = lambda k: Batch(torch.zeros(k, 4, dtype=torch.long), torch.zeros(k, 4, dtype=torch.long))  # noqa: E731
    with pytest.raises(GradscopeError, match="heldout_size"):
        sample_unique(same_row, 2)
    task = make_task(TaskConfig(vocab_size=2, length=1, heldout_size=1))
    every_row = torch.tensor([[0, 2], [1, 2]])
    with pytest.raises(GradscopeError, match="heldout_size"):
        sample_excluding(task, 4, torch.Generator().manual_seed(0), Excluder(every_row))


def test_options_of_zero_are_kept() -> None:
    from gradscope.presets import build_config
    assert build_config("tiny", {"beta1": 0.0}).train.betas[0] == 0.0
    assert build_config("tiny", {"clip": 0.0}).train.clip == 0.0
