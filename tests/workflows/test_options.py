"""The options of `stability`, `dynamics`, `accuracy`, `summarize` and `train` as dataclasses
(``gradscope.workflows.options``): what a value given as the CLI gives it becomes (strings, lists, paths),
the rules between fields as one-line refusals naming the field, which dynamics options a choice of parts
leaves unread, and what a dynamics store records of them. That the flags are generated from these fields is
tests/cli/test_generated.py's; that the workflow functions take them, tests/workflows/test_api.py's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gradscope.errors import GradscopeError
from gradscope.fields import DEFAULT_BINS, PARTS, RESAMPLES
from gradscope.workflows.options import (ACCURACY_BATCH, LADDERS, PROBE_SOURCE, AccuracyOptions, DynamicsOptions,
                                         SourceOptions, StabilityOptions, SummarizeOptions, TrainOptions,
                                         applied_options, check_read, derived_warmup, parse_bins, set_options,
                                         unread_options)


def refused(message: str) -> pytest.RaisesContext:
    """The whole one-line message, exactly."""
    return pytest.raises(GradscopeError, match=f"^{re.escape(message)}$")


# --- the dynamics parts and their options -----------------------------------------------------------------

def test_options_no_chosen_part_reads_are_named_with_the_reason() -> None:
    assert unread_options(None, {"steps", "sv", "sequences"}) is None  # every part: everything is read
    assert unread_options(("flow", "lyapunov"), {"steps", "sequences"}) is None
    assert unread_options(("flow",), {"reorth", "steps", "sv"}) == \
        (["steps", "reorth"], "they set the lyapunov part, which parts leaves out")  # in declaration order
    assert unread_options(("flow",), {"grid_sequences"}, "--parts") == \
        (["grid_sequences"], "they set the grid part, which --parts leaves out")
    assert unread_options(("lyapunov",), {"disturbant", "sequences"}) == \
        (["sequences", "disturbant"], "they set the probe sequences, which only the flow, grid, spectra and gates "
                                      "parts read")


def test_an_unread_option_is_refused_naming_it() -> None:
    check_read(("flow", "spectra"), {"sv", "sequences"})  # each read by a chosen part
    check_read(None, {"sv", "steps", "grid_sequences"})
    with refused("steps/reorth: they set the lyapunov part, which parts leaves out; remove steps and reorth"):
        check_read(("flow",), {"steps", "reorth"})
    with refused("sv: they set the spectra part, which parts leaves out; remove sv"):
        check_read(("grid", "gates"), {"sv"})
    with refused("target_freq: they set the probe sequences, which only the flow, grid, spectra and gates parts read; "
                 "remove target_freq"):
        check_read(("lyapunov",), {"target_freq"})


def test_a_store_records_the_options_applied_and_not_the_probes_source() -> None:
    everything = applied_options(DynamicsOptions(sv=4, steps=30, corpus="c", length=9))
    assert not set(PROBE_SOURCE) & set(everything)  # recorded as the probes themselves
    assert everything["sv"] == 4 and everything["steps"] == 30 and everything["lyap_warmup"] == 3
    lyapunov = applied_options(DynamicsOptions(parts=("lyapunov",), steps=30, sv=4))
    assert lyapunov == {"parts": ("lyapunov",), "trajectories": None, "steps": 30, "lyap_warmup": 3, "reorth": 1,
                        "seed": 0, "device": "auto", "exponents": None, "qr_dtype": "float64", "budget_seconds": 60.0}
    flow = applied_options(DynamicsOptions(parts=("flow",), sequences=2))
    assert flow["sequences"] == 2 and not {"steps", "trajectories", "grid_sequences", "sv"} & set(flow)


def test_the_derived_warmup_is_a_tenth_of_the_steps_at_most_100() -> None:
    assert [derived_warmup(s) for s in (1, 9, 10, 55, 1000, 1009, 5000)] == [0, 0, 1, 5, 100, 100, 100]
    assert DynamicsOptions(steps=55).lyap_warmup == 5 and DynamicsOptions().lyap_warmup is None
    assert DynamicsOptions(steps=55, lyap_warmup=0).lyap_warmup == 0  # given: kept


def test_set_options_are_those_away_from_their_defaults() -> None:
    assert set_options(DynamicsOptions()) == set()
    assert set_options(DynamicsOptions(parts=("flow",), sv=4)) == {"sv"}  # parts itself is not counted
    assert set_options(DynamicsOptions(steps=50)) == {"steps"}  # its derived warm-up is the steps' own
    assert set_options(DynamicsOptions(steps=50, lyap_warmup=7)) == {"steps", "lyap_warmup"}


def test_repeated_and_comma_separated_parts_are_one_list() -> None:
    assert DynamicsOptions(parts=("flow,grid", "lyapunov")).parts == ("flow", "grid", "lyapunov")


def test_parts_are_read_as_the_flag_gives_them_and_checked() -> None:
    assert DynamicsOptions(parts=" flow, gates ,").parts == ("flow", "gates")
    assert DynamicsOptions(parts=["grid", "grid,flow"]).parts == ("grid", "flow")  # each once, first order
    with refused(f"parts: got nope, x; valid parts are {', '.join(PARTS)}"):
        DynamicsOptions(parts="flow,nope,x")
    with refused(f"parts: got none; valid parts are {', '.join(PARTS)}"):  # empty is an error, never "all"
        DynamicsOptions(parts=" , ")
    with refused(f"parts: got 5; valid parts are {', '.join(PARTS)}"):
        DynamicsOptions(parts=5)  # type: ignore[arg-type]


def test_the_warmup_must_stay_below_the_steps() -> None:
    with refused("lyap_warmup: got 50; it must be an integer in [0, 49] (below steps = 50; leave it out for a "
                 "tenth of the steps, here 5)"):
        DynamicsOptions(steps=50, lyap_warmup=50)
    with refused("lyap_warmup: got 1000; it must be an integer in [0, 999] (below steps = 1000; leave it out for a "
                 "tenth of the steps, here 100)"):
        DynamicsOptions(lyap_warmup=1000)  # no steps: the largest the plan may choose
    with pytest.raises(GradscopeError, match=r"^lyap_warmup: got True; it must be an integer"):
        DynamicsOptions(lyap_warmup=True)  # type: ignore[arg-type]
    assert DynamicsOptions(lyap_warmup=999).lyap_warmup == 999


def test_filled_options_are_the_largest_each_may_take() -> None:
    assert not DynamicsOptions().resolved
    full = DynamicsOptions().filled()
    assert full.resolved and full.parts == PARTS
    assert (full.sequences, full.grid_sequences, full.trajectories, full.steps) == \
        tuple(LADDERS[n][0] for n in ("sequences", "grid_sequences", "trajectories", "steps"))
    assert full.lyap_warmup == derived_warmup(LADDERS["steps"][0])
    given = DynamicsOptions(parts=("flow",), steps=20, sequences=1).filled()
    assert (given.parts, given.steps, given.lyap_warmup, given.sequences) == (("flow",), 20, 2, 1)  # kept as given


def test_dynamics_groups_and_paths_become_their_types() -> None:
    opts = DynamicsOptions(target_freq=["rare", "frequent", "rare"], token_counts="counts.npy", corpus="c")
    assert opts.target_freq == ("rare", "frequent") and opts.token_counts == Path("counts.npy")
    assert opts.corpus == Path("c")
    with refused("device: got 3; expected a device name such as cpu"):
        DynamicsOptions(device=3)  # type: ignore[arg-type]


# --- stability, sources, train ---------------------------------------------------------------------------

def test_stability_groups_and_paths_become_their_types_or_are_refused() -> None:
    opts = StabilityOptions(disturbant=["all", "all"], probes="p.npz")
    assert opts.disturbant == ("all",) and opts.probes == Path("p.npz") and opts.target_freq == ()
    with refused("target_freq: got 'rare'; expected a tuple of groups (frequent, rare, all)"):
        StabilityOptions(target_freq="rare")  # type: ignore[arg-type]
    with refused("disturbant: got (1,); expected a tuple of groups (frequent, rare, all)"):
        StabilityOptions(disturbant=(1,))  # type: ignore[arg-type]
    with refused("probes: got int; expected a path"):
        StabilityOptions(probes=3)  # type: ignore[arg-type]


def test_an_exact_estimator_takes_no_sketch_size() -> None:
    with refused("sketch_units: it sizes a sketch; with estimator 'exact' leave it out"):
        StabilityOptions(estimator="exact", sketch_units=4)
    assert StabilityOptions(estimator="sketch", sketch_units=4).sketch_units == 4


def test_source_options_take_paths_as_strings() -> None:
    opts = SourceOptions(model_factory="hf", config="c.json", text="t.txt", counts_text="big.txt", tokenizer="tok")
    assert (opts.config, opts.text, opts.counts_text, opts.tokenizer) == \
        (Path("c.json"), Path("t.txt"), Path("big.txt"), Path("tok"))
    assert SourceOptions().model_factory is None
    with refused("model_factory: got int; expected FILE.py:FUNC, module:FUNC or hf[:CLASS]"):
        SourceOptions(model_factory=3)  # type: ignore[arg-type]
    with refused("tokenizer: got list; expected a path"):
        SourceOptions(tokenizer=["tok"])  # type: ignore[arg-type]


def test_train_options_take_paths_as_strings() -> None:
    opts = TrainOptions(resume="run", extend_from="parent")
    assert opts.resume == Path("run") and opts.extend_from == Path("parent")
    with refused("extend_from: got int; expected a path"):
        TrainOptions(extend_from=3)  # type: ignore[arg-type]


# --- accuracy ---------------------------------------------------------------------------------------------

def test_bins_are_a_count_or_edges_from_zero() -> None:
    assert parse_bins("4") == 4 and parse_bins("1") == 1
    assert parse_bins("0,8,64") == (0, 8, 64) and parse_bins(" 0, 8 ,64") == (0, 8, 64)
    with refused("bins: got 0; need at least 1 bin"):
        parse_bins("0")
    with refused("bins: got -2; need at least 1 bin"):
        parse_bins("-2")
    with refused("bins: got 'a,b'; give a number of bins (4) or edges (0,16,32,64)"):
        parse_bins("a,b")
    for text in ("0,3,1", "1,2", "0,8,8"):  # decreasing, not from 0, repeated
        with refused(f"bins: got {text!r}; edges must start at 0 and increase"):
            parse_bins(text)


def test_accuracy_options_as_the_flags_give_them() -> None:
    assert AccuracyOptions(bins="0,2,4").bins == (0, 2, 4) and AccuracyOptions(bins="3").bins == 3
    assert AccuracyOptions(corpus="c").corpus == Path("c")  # a Path, as stability's and dynamics' (the lm family's option)
    with refused("bins: got '1,2'; edges must start at 0 and increase"):
        AccuracyOptions(bins="1,2")


def test_the_grid_bins_default_to_quarters_or_one_per_position() -> None:
    assert AccuracyOptions().bins_for(None) == DEFAULT_BINS == 4
    assert [AccuracyOptions().bins_for(n) for n in (1, 3, 4, 64)] == [1, 3, 4, 4]  # a short grid: fewer bins
    assert AccuracyOptions(bins=2).bins_for(64) == 2 and AccuracyOptions(bins="0,8").bins_for(3) == (0, 8)  # as given


def test_what_accuracy_uses_when_an_option_is_left_out() -> None:
    left = AccuracyOptions()
    assert (left.batch_used, left.resamples_used, left.seed_used) == (ACCURACY_BATCH, RESAMPLES, 0)
    given = AccuracyOptions(batch_size=7, resamples=9, seed=3)
    assert (given.batch_used, given.resamples_used, given.seed_used) == (7, 9, 3)


# --- summarize --------------------------------------------------------------------------------------------

def test_summarize_options_as_the_flags_give_them() -> None:
    assert SummarizeOptions(by=("core", "pe")).by == "core,pe" and SummarizeOptions(by=["task"]).by == "task"
    assert SummarizeOptions(metric=["a", "b"]).metric == ("a", "b")
    assert SummarizeOptions(kind="stability").kind == "stability"


def test_summarize_refuses_a_bad_kind_grouping_metric_or_score() -> None:
    with refused("kind: got 'dynamics'; valid kinds are accuracy, stability"):
        SummarizeOptions(kind="dynamics")
    for by in ("", "core,,pe", "core, "):
        with refused(f"by: got {by!r}, an empty list or an empty item; give comma-separated fields such as core,pe "
                     f"(an empty one would pool every configuration into one group)"):
            SummarizeOptions(by=by)
    with refused("by: got int; expected field names (core,pe)"):
        SummarizeOptions(by=3)  # type: ignore[arg-type]
    with refused("metric: got 'token_accuracy'; expected metric names"):
        SummarizeOptions(metric="token_accuracy")  # type: ignore[arg-type]
    with refused("score: got 3; expected default, frobenius or l1"):
        SummarizeOptions(score=3)  # type: ignore[arg-type]
