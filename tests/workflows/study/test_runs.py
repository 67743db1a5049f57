"""A study's runs (``gradscope.workflows.study.runs``): the (core, PE, seed) runs planned from a scale's
configurations, what a planned run costs (tokens, parameters, a lower bound of its training memory, FLOPs)
computed by hand here, the memory refusals before anything starts, and where a study puts its outputs.
The study loop that trains them is tests/workflows/study/test_reproduce.py's."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gradscope.errors import GradscopeError
from gradscope.guard import byte_text
from gradscope.models import CORES, SeqModel
from gradscope.models.pe import pe_numbers
from gradscope.presets import scale_configs
from gradscope.tasks import make_task
from gradscope.workflows.stability import StabilityOptions
from gradscope.workflows.study import runs as runs_module
from gradscope.workflows.study.runs import PES, Layout, PlannedRun, check_run_sizes, plan_runs

from tests.helpers.runs import DEFAULT_CORE, OTHER_CORE, small_run


def refused(message: str) -> pytest.RaisesContext:
    return pytest.raises(GradscopeError, match=f"^{re.escape(message)}")


def test_a_planned_run_is_named_as_a_plain_directory() -> None:
    assert PlannedRun("gru-none-s1", small_run()).name == "gru-none-s1"
    for bad in ("../x", "a/b", ".hidden", ""):
        with refused(f"run name: got {bad!r}; expected a plain name"):
            PlannedRun(bad, small_run())


def test_tokens_parameters_and_flops_of_a_small_run() -> None:
    """small_run: reverse, L = 4 (rows of 2L = 8), batch 16, 20 iterations."""
    r = PlannedRun("r", small_run(iterations=20))
    assert r.tokens == 20 * 16 * 8
    with_weights = SeqModel(r.config.model)  # the model itself, on the CPU
    assert r.parameters == sum(p.numel() for p in with_weights.parameters())
    assert r.train_flops == 6.0 * r.parameters * r.tokens


def test_the_memory_bound_of_a_small_run_by_hand() -> None:
    """K = 8, E = 8, H = 16, one layer, no PE; L = 4, batch 16, 64 held-out rows, 2 per grid cell."""
    r = PlannedRun("r", small_run(DEFAULT_CORE))
    weights = (8 + 1) * 8 + 16 ** 2 + 16 * 8  # embedding, one H × H matrix, readout
    steps, width = 2 * 4, 8 + 2 * 16 + 8  # the input phase and the answer; embedding, states, logits per step
    grid = 4 * 2 * 4 * 4
    own = CORES[DEFAULT_CORE].token_floats(16, r.config.model.core_config)  # what the core keeps per token
    assert r.memory_bytes == 4 * (4 * weights + 16 * steps * (width + own)) + 8 * steps * (2 * 64 + grid)


def test_the_memory_bound_grows_with_a_position_table_and_a_cores_own_state() -> None:
    base = PlannedRun("r", small_run(DEFAULT_CORE))
    sinusoidal = PlannedRun("r", small_run(DEFAULT_CORE, pe="sinusoidal"))
    table = sinusoidal.config.model
    assert sinusoidal.memory_bytes - base.memory_bytes == \
        4 * 4 * pe_numbers("sinusoidal", table.embed_size, table.max_len) > 0  # weights, gradients, two moments
    base_own = CORES[DEFAULT_CORE].token_floats(16, base.config.model.core_config)
    owns = {}
    for core in CORES:  # a core with a state of its own per token (a selective scan's) adds it at every step
        r = PlannedRun("r", small_run(core))
        owns[core] = CORES[core].token_floats(16, r.config.model.core_config)
        assert r.memory_bytes - base.memory_bytes == 4 * 16 * 8 * (owns[core] - base_own), core
    assert len(set(owns.values())) > 1  # some core keeps a state of its own: the bound can tell


def test_the_study_plans_every_core_pe_and_seed_of_its_scale() -> None:
    runs = plan_runs("tiny", [OTHER_CORE, DEFAULT_CORE], [5, 2])
    planned = [(c, pe, s) for c in (OTHER_CORE, DEFAULT_CORE) for pe in PES for s in (5, 2)]
    assert [r.name for r in runs] == [f"{c}-{pe}-s{s}" for c, pe, s in planned]
    for r, (core, pe, seed) in zip(runs, planned):
        base = scale_configs("tiny")[core]
        task = make_task(base.task)  # the model reads every class the task has, at its full length
        assert r.config.model == dataclasses.replace(base.model, vocab_size=task.num_classes, max_len=task.total_len,
                                                     pe=pe)
        assert r.config.task == base.task
        assert r.config.train == dataclasses.replace(base.train, seed=seed)
    assert [r.config.model.pe for r in plan_runs("tiny", [DEFAULT_CORE], [1], pes=("sinusoidal",))] == ["sinusoidal"]


def test_fewer_iterations_scale_the_schedule() -> None:
    base = scale_configs("tiny")[DEFAULT_CORE].train
    t = plan_runs("tiny", [DEFAULT_CORE], [1], iterations=8)[0].config.train
    assert (t.iterations, t.checkpoint_every, t.log_every, t.warmup) == (8, 2, 2, 0)  # 4 checkpoints, a tenth warm-up
    t = plan_runs("tiny", [DEFAULT_CORE], [1], iterations=3)[0].config.train
    assert (t.iterations, t.checkpoint_every, t.log_every, t.warmup) == (3, 1, 1, 0)
    long = 40 * base.log_every
    t = plan_runs("tiny", [DEFAULT_CORE], [1], iterations=long)[0].config.train
    assert (t.checkpoint_every, t.log_every, t.warmup) == (long // 4, base.log_every, min(base.warmup, long // 10))


def test_a_bad_study_is_refused_naming_what() -> None:
    cores = ", ".join(scale_configs("tiny"))
    for args, message in (
            (("huge", [DEFAULT_CORE], [1]), "scale: got 'huge'; valid scales are tiny, paper"),
            (("tiny", [], [1]), f"models: give at least one of {cores}"),
            (("tiny", ["nope"], [1]), f"models: got 'nope'; valid models are {cores}"),
            (("tiny", [DEFAULT_CORE], []), "seeds: give at least one seed"),
            (("tiny", [DEFAULT_CORE], [1, 1]), "seeds: got [1, 1]; a seed given twice would train the same run twice"),
            (("tiny", [DEFAULT_CORE], [-3]), "seeds: got -3; it must be between 0 and"),
            (("tiny", [DEFAULT_CORE, DEFAULT_CORE], [1]),
             f"models: got {[DEFAULT_CORE] * 2}; a model given twice would train the same runs twice")):
        with refused(message):
            plan_runs(*args)  # type: ignore[arg-type]
    with refused("iterations: got 0; it must be positive"):
        plan_runs("tiny", [DEFAULT_CORE], [1], iterations=0)


def test_a_run_that_does_not_fit_in_memory_is_refused_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """small_run's stability over its 4 checkpoints, 2 triplets in each of 4 conditions (dual), 16 singular
    values (H): 8 · (2·3·2·4·8 + 2·4·(2·24 + 3·16)·8) = 52,224 bytes, more than its training needs."""
    r = PlannedRun("gru-none-s1", small_run(DEFAULT_CORE))
    train, probes = r.memory_bytes, 52_224
    assert train < probes - 1000
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", str(train - 1))
    with refused(f"gru-none-s1: training (hidden 16, vocab 8, batch 16): needs {byte_text(train)} of memory"):
        check_run_sizes(r)
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", str(probes - 1))
    check_run_sizes(r)  # training fits
    stability = StabilityOptions(triplets=2)
    with refused(f"triplets: needs {byte_text(probes)} of memory"):
        check_run_sizes(r, stability)
    check_run_sizes(r, stability, checkpoints=1)  # one checkpoint analysed fits
    check_run_sizes(r, StabilityOptions(triplets=2, target_freq=("rare",), disturbant=("rare",)))  # one condition
    check_run_sizes(r, StabilityOptions(triplets=2, sv=8))  # fewer singular values
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", str(probes))
    check_run_sizes(r, stability)
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", str(probes - 1))
    monkeypatch.setattr(runs_module, "probe_tasks", lambda: ())  # a task without probes: no stability to fit
    check_run_sizes(r, stability)


def test_the_layout_of_a_study(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    r = PlannedRun("gru-none-s1", small_run())
    assert layout.run(r) == tmp_path / "runs" / "gru-none-s1"
    assert layout.accuracy(r) == tmp_path / "stores" / "accuracy-gru-none-s1.zarr"
    assert layout.stability(r) == tmp_path / "stores" / "stability-gru-none-s1.zarr"
    assert layout.summary_accuracy == tmp_path / "summary-accuracy.zarr"
    assert layout.summary_stability == tmp_path / "summary-stability.zarr"
    assert layout.report == tmp_path / "report.html"
    assert not tmp_path.joinpath("runs").exists()  # paths only: nothing is made
