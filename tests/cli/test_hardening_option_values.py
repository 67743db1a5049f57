"""Option values of `stability`, `dynamics`, `sweep --dry-run`, `reproduce --dry-run` and every --device, drawn by
hypothesis with at most one of them bad: all valid gives exit 0 and what was asked, one bad value gives
exit 2 with one `error:` line and nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.fuzzkit import assert_clean, assert_untouched, count, invoke, leftovers, snapshot
from tests.helpers.hardening import BUDGET, FAST, FUZZ, L, Work, input_runs
from tests.helpers.runs import COMPLEX_CORE, DEFAULT_CORE, OTHER_CORE
from gradscope.store import read_store


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small trained checkpoints: "first" (the default core), "other" and a factory's "lm"."""
    return input_runs(tmp_path_factory)


# ---- option values -------------------------------------------------------------------------------

def one_bad(good: dict[str, list], bad: dict[str, list]) -> st.SearchStrategy:
    """(None, all-valid values) or (name, values with exactly that option bad): the oracle is then
    exact both ways (valid: exit 0 and the right output; one bad value: exit 2)."""

    @st.composite
    def draw_values(draw: st.DrawFn) -> tuple[str | None, dict]:
        which = draw(st.sampled_from([None, None, *bad]))
        values = {k: draw(st.sampled_from(v)) for k, v in good.items()}
        if which is not None:
            values[which] = draw(st.sampled_from(bad[which]))
        return which, values

    return draw_values()


STABILITY_GOOD = {"seed": [0, 7, 2**63 - 1], "triplets": [1, 2], "batch": [1, 3, 2**31 - 1], "pos": [1, L],
                  "sv": [1, 3, 2**31 - 1], "resamples": [1, 2], "target": [[], ["rare"], ["all", "rare"], ["rare", "rare"]],
                  "method": ["auto", "vjp", "analytic", "func"]}
STABILITY_BAD = {"seed": [-1, 2**63, 2**64, -(2**64)], "triplets": [0, -1, 10**8, 2**63], "batch": [0, -1, 2**64],
                 "pos": [0, -1, L + 1, 2**63], "sv": [0, -1, 2**64], "resamples": [0, -1, 10**7 + 1],
                 "target": [["bogus"], [""], ["rare", "x"]], "method": ["bogus", ""]}


def test_stability_option_values(runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", BUDGET)
    work = Work(tmp_path)

    @settings(max_examples=24, **FUZZ)
    @given(one_bad(STABILITY_GOOD, STABILITY_BAD))
    def check(case: tuple[str | None, dict]) -> None:
        which, v = case
        count("options-stability")
        w = work.new()
        args = ["stability", runs["first"], "-o", w / "s.zarr", "-q", "--seed", v["seed"], "--triplets", v["triplets"],
                "--batch-size", v["batch"], "--target-pos", v["pos"], "--sv", v["sv"], "--resamples", v["resamples"],
                "--method", v["method"], "--disturbant", "rare", *(a for g in v["target"] for a in ("--target-freq", g))]
        outcome = invoke(args)
        assert_clean(outcome, str(args))
        assert outcome.rc == (0 if which is None else 2), (which, outcome.err)
        if outcome.rc == 0:  # the store holds what was asked
            ds = read_store(w / "s.zarr")
            opts = json.loads(ds.attrs["options"])
            assert (opts["seed"], opts["target_pos"], opts["batch_size"], opts["method"]) == (v["seed"], v["pos"], v["batch"],
                                                                                       v["method"])
            assert ds.sizes["triplet"] == v["triplets"] * (len(set(v["target"])) or 2)
            assert ds.sizes["sv"] == min(v["sv"], 16)  # H = 16
        else:
            assert not (w / "s.zarr").exists() and not leftovers(w)

    check()


DYNAMICS_GOOD = {"seed": [0, 5], "sequences": [1], "steps": [8, 12], "lyap_warmup": [0, 2], "trajectories": [1],
                 "reorth": [1, 3], "grid": [1, 10**9], "parts": ["flow", "grid,lyapunov", "spectra,gates", "flow,flow"]}
DYNAMICS_BAD = {"seed": [-1, 2**63 - 1, 2**64], "sequences": [0, -1, 10**9], "steps": [0, 2**63, 10**9],
                "lyap_warmup": [-1, 12, 10**9], "trajectories": [0, 10**9], "reorth": [0, 2**63], "grid": [0, -1],
                "parts": ["bogus", "", "flow,bogus"]}


def test_dynamics_option_values(runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", BUDGET)
    work = Work(tmp_path)

    @settings(max_examples=12, **FUZZ)
    @given(one_bad(DYNAMICS_GOOD, DYNAMICS_BAD))
    def check(case: tuple[str | None, dict]) -> None:
        which, v = case
        count("options-dynamics")
        w = work.new()
        parts = v["parts"].split(",")
        lyapunov = ["--steps", v["steps"], "--lyap-warmup", v["lyap_warmup"], "--trajectories", v["trajectories"],
                    "--reorth", v["reorth"]] if "lyapunov" in parts else []  # a part's options only with it
        grid = ["--grid-sequences", v["grid"]] if "grid" in parts else []
        args = ["dynamics", runs["first"], "-o", w / "d.zarr", "-q", "--seed", v["seed"], "--sequences", v["sequences"],
                *lyapunov, *grid, "--parts", v["parts"], "--target-freq", "rare", "--disturbant", "rare"]
        outcome = invoke(args)
        assert_clean(outcome, str(args))
        passed = which in ("seed", "sequences", "parts") or (which == "grid" and bool(grid)) or \
            (which in ("steps", "lyap_warmup", "trajectories", "reorth") and bool(lyapunov))
        assert outcome.rc == (2 if passed else 0), (which, outcome.err)
        if outcome.rc == 0:
            opts = json.loads(read_store(w / "d.zarr").attrs["options"])
            assert (opts["seed"], opts["parts"]) == (v["seed"], list(dict.fromkeys(parts)))
            assert not lyapunov or (opts["steps"], opts["lyap_warmup"]) == (v["steps"], v["lyap_warmup"])
        else:
            assert not (w / "d.zarr").exists() and not leftovers(w)

    check()


SWEEP_GOOD = {"workers": [None, 1, 2], "threads": [None, 1, 8], "retries": [0, 3], "resources": [None, "GPU=1", "A=1,B=2"],
              "scheduler": [None, None, "tcp://127.0.0.1:8786", "localhost:8786", "tcp://[::1]:8786"]}
SWEEP_BAD = {"workers": [0, -1, 10**8], "threads": [0, 10**9], "retries": [-1, 10**9],
             "resources": ["GPU", "GPU=0", "GPU=nan", "GPU=inf", "=1"],
             "scheduler": ["bogus://", "tcp://", "host:0", "host:99999", "../x", "tcp://h:1/x"]}
REPRODUCE_GOOD = {"seeds": ["1", "1,2", "0", str(2**63 - 1)], "triplets": [1, 64], "iterations": [None, 1, 10**12],
                  "models": [DEFAULT_CORE, f"{OTHER_CORE},{COMPLEX_CORE}"]}
REPRODUCE_BAD = {"seeds": ["-1", "1,1", str(2**63), "a", "", "9" * 5000], "triplets": [0, -1, 10**9],
                 "iterations": [0, -1], "models": [f"{DEFAULT_CORE},{DEFAULT_CORE}", "bogus", ""]}


def test_sweep_and_reproduce_option_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", str(1 << 30))  # two local workers (256 MB each) fit
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.toml").write_text("name = \"g\"\n[settings]\niterations = 10\n[axes]\nseed = [1, 2]\n")
    before = snapshot(tmp_path)

    @settings(max_examples=20, **FUZZ)
    @given(one_bad(SWEEP_GOOD, SWEEP_BAD))
    def sweep(case: tuple[str | None, dict]) -> None:
        which, v = case
        count("options-sweep")
        if v["scheduler"] is not None and which != "workers":
            v["workers"] = None  # workers size a local cluster only
        args = ["sweep", "grid.toml", "--dry-run", "--retries", v["retries"]]
        for flag in ("workers", "threads", "resources", "scheduler"):
            if v[flag] is not None:
                args += [f"--{flag}", v[flag]]
        outcome = invoke(args)
        assert_clean(outcome, str(args))
        assert outcome.rc == (0 if which is None else 2), (which, outcome.err)
        if outcome.rc == 0:
            assert "2 grid points" in " ".join(outcome.out.split())

    @settings(max_examples=15, **FUZZ)
    @given(one_bad(REPRODUCE_GOOD, REPRODUCE_BAD))
    def reproduce(case: tuple[str | None, dict]) -> None:
        which, v = case
        count("options-reproduce")
        args = ["reproduce", "--dry-run", "--no-measure", "--seeds", v["seeds"], "--triplets", v["triplets"],
                "--models", v["models"], "-o", "study", *(("--iterations", v["iterations"]) if v["iterations"] else ())]
        outcome = invoke(args)
        assert_clean(outcome, str(args))
        assert outcome.rc == (0 if which is None else 2), (which, outcome.err)
        if outcome.rc == 0:  # one row per model × PE × seed
            runs = len(v["models"].split(",")) * 2 * len(v["seeds"].split(","))
            assert sum(" ".join(ln.split()).startswith("│ ") and "-s" in ln for ln in outcome.out.splitlines()) == runs

    sweep()
    reproduce()
    assert_untouched(before, snapshot(tmp_path))  # dry runs write nothing


def test_device_option_values(runs: dict[str, Path], tmp_path: Path) -> None:
    """Device names reach the device parser (gradscope.train.device) through every option class."""
    for i, device in enumerate(["cpu", "meta", "xpu", "cuda:7", "", "cpu:-1"]):
        for command, extra in (("stability", ("--triplets", "1", *FAST)),
                               ("dynamics", ("--sequences", "1", "--steps", "8", "--lyap-warmup", "1", "-q"))):
            count("options-device")
            out = tmp_path / f"{command}{i}.zarr"
            outcome = invoke([command, runs["first"], "-o", out, "--device", device, "--target-freq", "rare",
                              "--disturbant", "rare", *extra])
            assert_clean(outcome, f"{command} --device {device!r}")
            assert outcome.rc == 2 or device in ("cpu", "auto", "cpu:0"), device
            assert out.exists() == (outcome.rc == 0)
