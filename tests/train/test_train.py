"""Training: learning, exact resume, and the objective its family declares (SPEC §3). The schedule is tested in
tests/train/test_schedule.py, the held-out evaluation in tests/train/test_evaluate.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.runs import COMPLEX_CORE, DEFAULT_CORE, OTHER_CORE, logged_iteration, small_run
from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.files.checkpoint import load
from gradscope.train import train


def test_tiny_gru_learns_reverse(tmp_path: Path) -> None:
    """Seeded: a tiny model of the default core (a GRU) on reverse (K=8, L=8) reaches > 90% held-out token accuracy."""
    cfg = RunConfig(
        model=ModelConfig(core=DEFAULT_CORE, vocab_size=8, embed_size=32, hidden_size=64, max_len=16),
        task=TaskConfig(name="reverse", vocab_size=8, length=8, heldout_size=256),
        train=TrainConfig(iterations=1500, batch_size=64, lr=1e-2, warmup=100, checkpoint_every=500, log_every=100,
                          seed=3),
    )
    result = train(cfg, tmp_path / "run")
    assert result["uniform"]["token_accuracy"] > 0.9, result
    assert json.loads((tmp_path / "run" / "eval.json").read_text()) == result


def _params(run: Path) -> dict[str, torch.Tensor]:
    return load(run).model.state_dict()


@pytest.mark.parametrize("core", [DEFAULT_CORE, OTHER_CORE, COMPLEX_CORE])
def test_resume_is_bit_identical(tmp_path: Path, core: str) -> None:
    cfg = small_run(core=core, pe="sinusoidal", iterations=24)
    train(cfg, tmp_path / "full")
    assert train(cfg, tmp_path / "split", stop_after=12) == {}
    assert load(tmp_path / "split").iteration == 12
    train(cfg, tmp_path / "split", resume=True)
    a, b = _params(tmp_path / "full"), _params(tmp_path / "split")
    # bit for bit: the same machine, thread count and code path (training is deterministic by construction there)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    full = load(tmp_path / "full").raw["optimizer"]["state"]
    split = load(tmp_path / "split").raw["optimizer"]["state"]
    assert all(torch.equal(full[i]["exp_avg_sq"], split[i]["exp_avg_sq"]) for i in full)
    strip = lambda p: [{k: v for k, v in json.loads(l).items() if k != "tokens_per_s"}  # noqa: E731
                       for l in (p / "metrics.jsonl").read_text().splitlines()]
    assert strip(tmp_path / "full") == strip(tmp_path / "split")


def _log(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_killed_run_resumes_to_the_same_weights(tmp_path: Path) -> None:
    """SIGKILL a CLI training run between checkpoints, with log lines written past its last one;
    --resume, stopped at iteration 400 with --stop-after, ends bit-identical (weights, optimizer
    state, log) to an uninterrupted run of the same configuration stopped at 400 (both keep the
    4000-iteration schedule)."""
    stop = 400
    args = ["--vocab-size", "8", "--length", "6", "--hidden-size", "32", "--embed-size", "16", "--iterations", "4000",
            "--checkpoint-every", "50", "--log-every", "10", "--batch-size", "32", "--seed", "5", "--quiet",
            "--threads", "1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-c", "from gradscope.cli.app import main; main()", "train"]
    # run from tmp_path: from the repo root, '' on sys.path would shadow the installed package
    whole = subprocess.Popen([*cmd, "-o", str(tmp_path / "whole"), *args, "--stop-after", str(stop)], env=env,
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    victim = subprocess.Popen([*cmd, "-o", str(tmp_path / "killed"), *args], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        # kill 10-20 iterations past a checkpoint: the log then holds lines the resumed run must redo
        while not (logged_iteration(tmp_path / "killed") % 50 in (10, 20) and list((tmp_path / "killed").glob("step-*.pt"))):
            assert victim.poll() is None, f"training exited early: {victim.stderr.read() if victim.stderr else ''}"
            assert time.time() < deadline, "no checkpoint within 120 s"
            time.sleep(0.02)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        assert not list((tmp_path / "killed").glob(".*tmp")), "a temporary file was left behind"
        reached = load(tmp_path / "killed").iteration
        assert reached < stop, f"the run was past {stop} iterations ({reached}) before it could be killed"
        subprocess.run([*cmd, "--resume", str(tmp_path / "killed"), "--quiet", "--stop-after", str(stop - reached)],
                       env=env, check=True, cwd=tmp_path, stdout=subprocess.DEVNULL)
        assert whole.wait(timeout=300) == 0, whole.stderr.read() if whole.stderr else ""
    finally:
        for p in (whole, victim):
            if p.poll() is None:
                p.kill()
                p.wait()
    killed, fresh = load(tmp_path / "killed"), load(tmp_path / "whole")
    assert killed.iteration == fresh.iteration == stop
    a, b = killed.model.state_dict(), fresh.model.state_dict()
    # bit for bit: the same machine, thread count and code path
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = killed.raw["optimizer"]["state"], fresh.raw["optimizer"]["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    assert _log(tmp_path / "killed") == _log(tmp_path / "whole")  # the redone log lines replaced, not appended
    assert not (tmp_path / "killed" / "eval.json").exists()  # stopped, not finished


def test_training_computes_gradients_inside_a_callers_no_grad(tmp_path: Path) -> None:
    """A worker thread whose gradient mode was left off (by any earlier task) still trains."""
    cfg = small_run(iterations=10)
    train(cfg, tmp_path / "plain")
    with torch.no_grad():
        train(cfg, tmp_path / "no-grad")
    a, b = _params(tmp_path / "plain"), _params(tmp_path / "no-grad")
    # bit for bit: the same process and code path
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_refused_before_its_first_step_leaves_no_directory(tmp_path: Path, monkeypatch) -> None:
    """A GradscopeError before iteration 1 (here: no batch could be drawn) removes the config and log
    the start wrote, and the directory it created, so the same command can start again; a directory
    that existed before is kept."""
    import gradscope.train.loop as loop
    from gradscope.errors import GradscopeError

    def refuse(*_args, **_kwargs):
        raise GradscopeError("heldout_size: could not draw a training batch")

    monkeypatch.setattr(loop, "sample_excluding", refuse)
    with pytest.raises(GradscopeError, match="could not draw"):
        train(small_run(iterations=4), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(GradscopeError, match="could not draw"):
        train(small_run(iterations=4), tmp_path / "kept")
    assert (tmp_path / "kept").is_dir() and not any((tmp_path / "kept").iterdir())
    monkeypatch.undo()
    train(small_run(iterations=4), tmp_path / "run")  # starts again where it was refused
    assert (tmp_path / "run" / "eval.json").is_file()


def test_the_loop_trains_on_the_objective_its_family_declares(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The training objective is the task family's (Task.objective; issue #39): a family registered here whose
    objective is its default cross-entropy plus 5 logs 5 more, and an objective that is 0 × the loss leaves
    the weights where they started (Adam's step on zero gradients is zero)."""
    from gradscope.tasks.registry import TASKS

    base = TASKS["reverse"]
    calls: list[int] = []

    class Shifted(base):  # type: ignore[misc, valid-type]
        @classmethod
        def objective(cls, outputs: torch.Tensor, targets: torch.Tensor):  # noqa: ANN206
            calls.append(outputs.shape[0])
            loss, right, scored = base.objective(outputs, targets)
            return loss + 5.0, right, scored

    class Frozen(base):  # type: ignore[misc, valid-type]
        @classmethod
        def objective(cls, outputs: torch.Tensor, targets: torch.Tensor):  # noqa: ANN206
            loss, right, scored = base.objective(outputs, targets)
            return loss * 0.0, right, scored

    cfg = small_run(iterations=5)
    train(cfg, tmp_path / "plain")
    monkeypatch.setitem(TASKS, "reverse", Shifted)
    train(cfg, tmp_path / "shifted")
    assert calls == [cfg.train.batch_size] * 5
    logged = [json.loads(line)["loss"] for line in (tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()]
    shifted = [json.loads(line)["loss"] for line in (tmp_path / "shifted" / "metrics.jsonl").read_text().splitlines()]
    assert shifted == pytest.approx([v + 5.0 for v in logged], rel=1e-6)
    monkeypatch.setitem(TASKS, "reverse", Frozen)
    still = RunConfig(model=cfg.model, task=cfg.task, train=TrainConfig(**{**cfg.train.__dict__, "iterations": 3,
                                                                           "checkpoint_every": 1}))
    train(still, tmp_path / "frozen")
    first, last = (load(tmp_path / "frozen" / f"step-000000{i}.pt").model.state_dict() for i in (1, 3))
    assert all(torch.equal(first[k], last[k]) for k in first)
