"""Sweep specs as `gradscope sweep --dry-run` reads them: valid specs, then at most one mutation drawn by
hypothesis (bad names, presets, settings, axes and tables, deep nesting, inserted or cut text, grids too
large), and names that would escape the working directory. Every spec ends in exit 0 with the spec's
grid planned inside the working directory, or in exit 2 with one `error:` line; nothing is written.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.fuzzkit import assert_clean, assert_untouched, count, invoke, snapshot
from tests.helpers.hardening import BUDGET, FUZZ
from tests.helpers.runs import COMPLEX_CORE, DEFAULT_CORE, OTHER_CORE


# ---- sweep specs ---------------------------------------------------------------------------------

def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml(doc: dict) -> str:
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"[{json.dumps(k)}]")
            lines += [f"{json.dumps(kk)} = {toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


BAD_NAMES = st.sampled_from(["/../../x", "../up", "a/b", ".hidden", "", "x" * 300, "ok name", "tab\tname", "..",
                             "C:\\x", "ünï", 3, 1.5, True, [1], {"a": 1}])
SCALARS = st.one_of(st.integers(-2, 40), st.sampled_from([10**6, 10**9, 10**12, 2**63, 10**30, 0.5, float("nan"),
                                                          float("inf"), DEFAULT_CORE, OTHER_CORE, COMPLEX_CORE, "none", "sinusoidal",
                                                          "../x", "", True]))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.sampled_from(["a", "b"]), SCALARS,
                                                                           max_size=2))
SETTING_KEYS = st.sampled_from(["hidden_size", "vocab_size", "iterations", "batch_size", "lr", "embed_size", "num_layers",
                                "length", "heldout_size", "checkpoint_every", "max_len", "seed", "bogus", "device", "pe",
                                "core"])
AXIS_KEYS = st.sampled_from(["seed", "pe", "core", "vocab_size", "hidden_size", "task", "bogus"])
TABLE_KEYS = {"accuracy": ["checkpoints", "bins", "device", "bogus"],
              "stability": ["checkpoints", "target_freq", "disturbant", "triplets", "target_pos", "position", "seed", "device"]}


@st.composite
def specs(draw: st.DrawFn) -> tuple[str, str]:
    """(mutation, TOML text): a valid spec, then at most one mutation."""
    doc: dict = {"name": draw(st.sampled_from(["grid", "g-1", "sweep_2", "a.b"])), "settings": {"iterations": 10},
                 "axes": {"seed": draw(st.sampled_from([[1], [1, 2]]))}}
    if draw(st.booleans()):
        doc["axes"]["pe"] = ["none", "sinusoidal"]
    if draw(st.booleans()):
        doc["stability"] = {"triplets": 2, "checkpoints": "last"}
    mutation = draw(st.sampled_from(["none", "none", "name", "preset", "settings", "axes", "table", "deep", "insert",
                                     "cut", "table-as-value", "grid"]))
    if mutation == "name":
        doc["name"] = draw(BAD_NAMES)
    elif mutation == "preset":
        doc["preset"] = draw(st.sampled_from(["paper", "bogus", 3, ""]))
    elif mutation == "settings":
        doc["settings"][draw(SETTING_KEYS)] = draw(VALUES)
    elif mutation == "axes":
        doc["axes"][draw(AXIS_KEYS)] = draw(st.one_of(st.lists(SCALARS, min_size=0, max_size=3), SCALARS))
    elif mutation == "table":
        table = draw(st.sampled_from(list(TABLE_KEYS)))
        doc[table] = {**doc.get(table, {}), draw(st.sampled_from(TABLE_KEYS[table])): draw(st.one_of(
            SCALARS, st.sampled_from(["all", "last", [5], [1, 2], ["rare"], "frequent", 10**8, -1, 2**63])))}
    elif mutation == "grid":
        doc["axes"] = {"seed": list(range(1, 120)), "hidden_size": list(range(1, 120))}
    text = toml(doc)
    if mutation == "deep":
        depth = draw(st.sampled_from([50, 3000]))
        text += "deep = " + "[" * depth + "]" * depth + "\n"
    elif mutation == "insert":
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.sampled_from(["[", "]", "=", "\"", "\n[axes]\n", "\x00", "é", "{"])) + text[i:]
    elif mutation == "cut":
        text = text[:draw(st.integers(0, len(text)))]
    elif mutation == "table-as-value":
        text = text.replace("[\"axes\"]", "\"axes\" = 1\n[\"x\"]")
    return mutation, text


def test_sweep_spec_mutations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gradscope.guard import inside
    from gradscope.workflows.sweep.grid import plan_points, read_spec
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", BUDGET)
    watched = tmp_path / "watched"
    (watched / "cwd").mkdir(parents=True)
    monkeypatch.chdir(watched / "cwd")
    before = snapshot(tmp_path)
    specs_dir = tmp_path / "specs"
    specs_dir.mkdir()
    n = 0

    @settings(max_examples=50, **FUZZ)
    @given(specs())
    def check(case: tuple[str, str]) -> None:
        nonlocal n
        mutation, text = case
        n += 1
        count("sweep-spec")
        spec = specs_dir / f"s{n}.toml"
        spec.write_text(text, encoding="utf-8")
        outcome = invoke(["sweep", spec, "--dry-run"])
        assert_clean(outcome, text[:200])
        if mutation in ("none", "name", "grid", "table-as-value") or mutation == "deep" and len(text) > 5000:
            assert outcome.rc == (0 if mutation == "none" else 2), (mutation, text[:200], outcome.err)
        if outcome.rc == 0:  # the plan shown is the spec's grid, and its directory stays in the working directory
            parsed = read_spec(spec)
            points = plan_points(parsed)
            assert f"{len(points)} grid points" in " ".join(outcome.out.split())
            inside(Path.cwd(), f"sweep-{parsed.name}", "out")
            for p in points:
                inside(Path.cwd() / "runs", p.name, "run")

    check()
    after = snapshot(tmp_path)
    assert_untouched(before, after, new_ok=("specs",))


def test_escaping_names_and_bombs_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the fix: name = "/../../x" planned sweep-/../../x, outside the working directory; a
    deeply nested spec raised RecursionError; --scheduler bogus:// raised ValueError."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", BUDGET)
    cases = {"name = \"/../../x\"\n[axes]\nseed = [1]\n": "name",
             "a = " + "[" * 5000 + "]" * 5000 + "\n": "too deeply",
             "[settings]\nhidden_size = 100000\n[axes]\nseed = [1]\n": "memory",
             "[axes]\nseed = " + str(list(range(1, 300))) + "\nhidden_size = " + str(list(range(1, 300))) + "\n": "grid points"}
    for i, (text, message) in enumerate(cases.items()):
        (tmp_path / f"{i}.toml").write_text(text)
        outcome = invoke(["sweep", tmp_path / f"{i}.toml", "--dry-run"])
        count("sweep-spec")
        assert outcome.rc == 2 and message in outcome.err, outcome.err
    (tmp_path / "ok.toml").write_text("[axes]\nseed = [1]\n")
    outcome = invoke(["sweep", tmp_path / "ok.toml", "--scheduler", "bogus://", "--dry-run"])
    assert outcome.rc == 2 and "--scheduler" in outcome.err, outcome.err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{i}.toml" for i in range(4)] + ["ok.toml"])
