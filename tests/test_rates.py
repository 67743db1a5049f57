"""Plans that hold on any CPU (issue #47 part 2): rates measured on the machine that plans, and the run-time
watches that keep a command within OVERRUN × its budget when the work runs slower than planned."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path

import pytest
import torch

import gradscope.rates as rates_mod
from gradscope.analysis.cost import OVERRUN, REFERENCE, PlanWarning, Rates
from gradscope.analysis.stability import plan_stability
from gradscope.errors import GradscopeError
from gradscope.rates import machine_rates, pinned, rounded
from gradscope.tasks.probes import make_probes
from gradscope.workflows import dynamics as dyn_wf
from gradscope.workflows.dynamics import DynamicsOptions, PartWatch, core_shape, plan_core
from gradscope.workflows.dynamics_cost import part_seconds
from gradscope.workflows.options import StabilityOptions
from gradscope.workflows.stability import watched_stability
from tests.helpers.cores import tiny_model
from tests.helpers.runs import DEFAULT_CORE


def test_factors_round_to_quarter_powers_of_two_with_a_dead_zone() -> None:
    assert rounded(1.0) == rounded(1.15) == rounded(0.87) == 1.0  # noise on the reference CPU plans as before
    assert rounded(1.6) == pytest.approx(2 ** 0.75)
    assert rounded(2.1) == 2.0 and rounded(0.5) == 0.5
    assert rounded(1e-9) == 1 / 16 and rounded(float("nan")) == 1.0 and rounded(-3.0) == 1.0


@pytest.mark.parametrize("text", ["", "1", "nan,1", "1,inf", "-1,1", "0,1", "1,2,3,4", "fast"])
def test_a_bad_pin_is_one_line(text: str) -> None:
    with pytest.raises(GradscopeError, match="GRADSCOPE_RATES"):
        pinned(text)


def test_pins() -> None:
    assert pinned("reference") is REFERENCE
    assert pinned("2, 0.5") == Rates(2.0, 0.5, 1.0, "pinned")
    assert pinned("2,1,1.5").flop == 3.0


@pytest.fixture
def probes_at(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - a setter
    """The probes' seconds and the run queue, set by the test (no timing, no /proc)."""
    state = {"factor": 1.0, "others": 0, "queue": 1.0}
    threads = torch.get_num_threads()
    monkeypatch.delenv("GRADSCOPE_RATES", raising=False)
    monkeypatch.setattr(rates_mod, "probe_seconds",
                        lambda: {k: v * state["factor"] for k, v in rates_mod._reference(threads).items()})
    monkeypatch.setattr(rates_mod, "runnable_others", lambda: state["others"])
    monkeypatch.setattr(rates_mod, "queue_slowdown", lambda threads: state["queue"])
    monkeypatch.setattr(rates_mod, "usable_cores", lambda: threads)
    return state


def test_first_use_measures_and_caches_the_idle_machine(tmp_path: Path, probes_at: dict) -> None:
    cache = tmp_path / "rates.json"
    probes_at["factor"] = 2.0  # a CPU half as fast as the reference
    first = machine_rates(cache=cache)
    assert (first.compute, first.dispatch, first.load, first.source) == (2.0, 2.0, 1.0, "measured")
    entry = json.loads(cache.read_text())[rates_mod.machine_key(torch.get_num_threads())]
    assert entry["compute"] == 2.0
    probes_at["factor"] = 4.0  # the same machine, twice as slow as it was idle ...
    assert machine_rates(cache=cache).load == 1.0  # ... with nothing else runnable: timing noise, not load
    probes_at["others"] = 3  # ... with three other tasks wanting the cores: load
    later = machine_rates(cache=cache)
    assert (later.compute, later.load, later.source) == (2.0, 2.0, "measured, cached")
    assert later.flop == 4.0


def test_the_run_queues_share_counts_when_a_short_probe_misses_the_load(tmp_path: Path, probes_at: dict) -> None:
    """Two busy processes on two cores: a 0.25 s probe ran at full speed (the scheduler favours a task that just
    woke), but a long run gets 2/3 of a core (measured: qwen3next-125m's dynamics defaults, estimated at 55 s,
    took 82 s). The run queue's share by weight sets the load then; with nothing else runnable it does not."""
    cache = tmp_path / "rates.json"
    machine_rates(cache=cache)  # the idle calibration
    probes_at.update(others=2, queue=1.5)
    assert machine_rates(cache=cache).load == rounded(1.5) > 1.4
    probes_at.update(others=0)
    assert machine_rates(cache=cache).load == 1.0
    probes_at.update(others=2, queue=1.0, factor=2.0)  # and the probe's own slowdown still counts
    assert machine_rates(cache=cache).load == 2.0


def test_a_measurement_under_load_is_never_cached(tmp_path: Path, probes_at: dict) -> None:
    cache = tmp_path / "rates.json"
    probes_at.update(factor=3.0, others=4)
    got = machine_rates(cache=cache)
    assert got.source == "measured under load" and got.compute == rounded(3.0) and got.load == 1.0
    assert not cache.exists()


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"x": 1}', ""])
def test_a_broken_cache_is_measured_again(tmp_path: Path, probes_at: dict, content: str) -> None:
    cache = tmp_path / "rates.json"
    cache.write_text(content)
    assert machine_rates(cache=cache).source == "measured"
    assert isinstance(json.loads(cache.read_text()), dict)


def test_the_suite_plans_at_the_reference_rates() -> None:
    assert machine_rates() is REFERENCE


def test_plans_scale_with_the_rates() -> None:
    model = tiny_model(DEFAULT_CORE, 16, 8, 32).float()
    base = plan_stability(model.core, 96, 16, 2, estimator="exact")
    slow = plan_stability(model.core, 96, 16, 2, estimator="exact", rates=Rates(3.0, 3.0))
    assert slow.seconds == pytest.approx(3 * base.seconds)
    assert "this machine's rates" in slow.note and "this machine's rates" not in base.note
    shape = core_shape(model.core, 8)
    sizes = dict(n=16, T=16, grid_sequences=4, sv=8, trajectories=4, steps=100, exponents=8, flow_method="jacobian")
    ref = part_seconds(shape, **sizes)
    calls = part_seconds(dataclasses.replace(shape, rates=Rates(1.0, 2.0)), **sizes)
    flops = part_seconds(dataclasses.replace(shape, rates=Rates(2.0, 1.0)), **sizes)
    both = part_seconds(dataclasses.replace(shape, rates=Rates(1.0, 1.0, 2.0)), **sizes)
    for part in ref:  # each factor prices its own terms; together (the load) they double every part
        assert ref[part] < calls[part] < both[part] and ref[part] < flops[part] < both[part]
        assert calls[part] + flops[part] == pytest.approx(ref[part] + both[part])


def test_a_slow_machine_gets_a_smaller_plan_before_any_work() -> None:
    model = tiny_model(DEFAULT_CORE, 16, 8, 32).float()
    opts = DynamicsOptions(budget_seconds=5.0)
    fast = plan_core(model.core, opts, 0, 32, width=8, conditions=4, rates=REFERENCE)
    slow = plan_core(model.core, opts, 0, 32, width=8, conditions=4, rates=Rates(8.0, 8.0))
    assert sum(slow.seconds.values()) <= 5.0 and sum(fast.seconds.values()) <= 5.0
    assert slow.options != fast.options  # less work fits, and the plan says so
    assert any("fit the 5 s budget" in line or "left out" in line for line in slow.lines)
    assert "compute ×8" in slow.describe()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _watch(monkeypatch: pytest.MonkeyPatch, seconds: dict[str, float], budget: float, *, may_drop: bool = True,
           checkpoints: int = 1) -> tuple[PartWatch, Clock]:
    clock = Clock()
    monkeypatch.setattr(dyn_wf.time, "perf_counter", clock)
    plan = dyn_wf.DynamicsPlan(0, "none", "", DynamicsOptions(parts=tuple(seconds), budget_seconds=budget),
                               dict(seconds), checkpoints)
    return PartWatch(plan, may_drop=may_drop), clock


def test_the_watch_leaves_out_the_biggest_parts_ahead_when_the_run_is_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    watch, clock = _watch(monkeypatch, {"flow": 10.0, "grid": 1.0, "spectra": 5.0, "lyapunov": 40.0}, 60.0)
    assert watch("flow")  # the first part always runs: it is the measurement
    clock.now = 20.0  # twice its estimate: the rest would take 2 × 46 s more, past 1.2 × 60 s
    with pytest.warns(PlanWarning, match="grid|lyapunov") as said:
        assert watch("grid")  # small: lyapunov is the one to leave out
        clock.now = 22.0
        assert watch("spectra")
        clock.now = 32.0  # still twice the estimate
        assert not watch("lyapunov")
    assert len(said) == 1 and "lyapunov left out while running" in str(said[0].message)
    watch("")
    assert watch.dropped == ["lyapunov"] and clock.now <= OVERRUN * 60
    plan = watch.applied(watch.plan)
    assert plan.options.parts == ("flow", "grid", "spectra") and "lyapunov" not in plan.seconds
    assert plan.engine == "none" and any("left out while running" in line for line in plan.lines)


def test_the_watch_keeps_what_fits_and_what_was_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    watch, clock = _watch(monkeypatch, {"flow": 10.0, "lyapunov": 40.0}, 60.0)
    assert watch("flow")
    clock.now = 12.0  # 1.2 × its estimate: 12 + 48 = 60 s, inside the budget
    assert watch("lyapunov") and not watch.dropped
    asked, clock = _watch(monkeypatch, {"flow": 10.0, "lyapunov": 40.0}, 60.0, may_drop=False)
    assert asked("flow")
    clock.now = 50.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert asked("lyapunov")  # --parts given: the user's parts all run


def test_the_watch_counts_the_later_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    watch, clock = _watch(monkeypatch, {"flow": 5.0, "lyapunov": 5.0}, 60.0, checkpoints=6)
    assert watch("flow")
    clock.now = 7.5  # 1.5 × : 7.5 + 1.5 × (5 + 5 × 10) = 90 s > 72 s
    with pytest.warns(PlanWarning):
        assert not watch("lyapunov")
    assert 7.5 + 1.5 * 5 * 5 <= OVERRUN * 60  # what is left fits


def _stability_case(estimator: str = "auto", units: int | None = None, budget: float = 1.0):  # noqa: ANN202
    model = tiny_model(DEFAULT_CORE, 16, 8, 128).float()  # exact costs more than a small sketch here
    probes = make_probes(24, 6, 2, 15, [("frequent", "frequent"), ("rare", "rare")], seed=0)  # 48 triplets
    opts = StabilityOptions(estimator=estimator, sketch_units=units, checkpoint_budget_seconds=budget, batch_size=8)
    return model, probes, opts


def _slow_clock(monkeypatch: pytest.MonkeyPatch, first_chunk: float) -> None:
    """The first chunk of the first attempt takes ``first_chunk`` seconds; everything else ~nothing."""
    import gradscope.workflows.stability as stab_wf
    ticks = iter([0.0, first_chunk])
    last = [first_chunk]

    def now() -> float:
        last[0] = next(ticks, last[0] + 1e-3)
        return last[0]

    monkeypatch.setattr(stab_wf.time, "perf_counter", now)


def test_stability_plans_again_when_its_first_chunk_is_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    model, probes, opts = _stability_case()
    exact = plan_stability(model.core, 3 * len(probes), 12, 2, estimator="exact").seconds
    assert 3 * exact > OVERRUN * 1.0  # at 3× the reference pace exact would overrun the 1 s budget
    _slow_clock(monkeypatch, 3 * exact * 8 / len(probes))  # the first 8 triplets at 3× their estimate
    plans, progress = [], []
    with pytest.warns(PlanWarning, match="planned again after the first 8 triplets, which took 3×"):
        result, plan, rates = watched_stability(model, probes, 2, opts, "query", REFERENCE, progress.append,
                                                plans.append)
    assert [p.estimator for p in plans] == ["exact", "sketch"] and plan is plans[-1]
    assert plan.seconds <= 1.0 and 4 <= plan.units <= 16  # the most units that fit at the measured pace
    assert result.estimator == "sketch" and result.scores["default"].shape == (2, len(probes))
    assert sum(progress) == len(probes)  # the dropped chunk is never counted
    assert rates.compute == pytest.approx(3.0)  # the next checkpoint plans at the measured pace


def test_stability_keeps_a_fixed_plan_and_says_it_runs_over(monkeypatch: pytest.MonkeyPatch) -> None:
    model, probes, opts = _stability_case("exact")
    _slow_clock(monkeypatch, 0.5)
    with pytest.warns(PlanWarning, match="past its 1 s budget .*fixed by --estimator"):
        result, plan, _ = watched_stability(model, probes, 2, opts, "query", REFERENCE, None, None)
    assert plan.estimator == "exact" and result.estimator == "exact"


def test_stability_on_time_changes_nothing() -> None:
    model, probes, opts = _stability_case()
    opts = dataclasses.replace(opts, checkpoint_budget_seconds=600.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        result, plan, rates = watched_stability(model, probes, 2, opts, "query", REFERENCE, None, None)
    assert plan.estimator == "exact" and rates is REFERENCE
    assert math.isfinite(float(result.scores["default"].nanmean()))


def test_the_watch_trusts_the_pace_only_once_it_means_something(monkeypatch: pytest.MonkeyPatch) -> None:
    """gradscope's Mamba sample: its small flow took 2.3× its estimate while the whole plan erred 5× long;
    a pace measured on a few percent of the budget drops nothing."""
    watch, clock = _watch(monkeypatch, {"flow": 0.9, "grid": 1.1, "spectra": 15.7, "lyapunov": 1.7}, 60.0,
                          checkpoints=3)
    assert watch("flow")
    clock.now = 2.1  # 2.3× the flow's estimate, 3.5 % of the budget
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        assert watch("grid") and watch("spectra")
    clock.now = 14.0  # now the pace counts: 14 s for 17.7 s estimated, the rest fits
    assert watch("lyapunov") and watch.ratio == pytest.approx(14.0 / 17.7)
