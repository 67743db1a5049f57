"""The repeated-defaults finder (tests/project/repeated_defaults.py) on planted sources, and the real
tree held to a baseline that only goes down: each option's default is declared once."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.project.repeated_defaults import ROOT, Repeat, copies, distinctive, main, repeated_defaults, table

# Repeats in the library: none; a default is declared once (a module constant, used by name everywhere else).
BASELINE = 0


def plant(root: Path, files: dict[str, str]) -> Path:
    for rel, source in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    for package in ("gradscope", "cli", "reports"):
        (root / package).mkdir(parents=True, exist_ok=True)
    return root


def by_name(repeats: list[Repeat]) -> dict[tuple[str, object], tuple[str, ...]]:
    return {(r.name, r.value): r.places for r in repeats}


def test_a_default_in_two_functions_is_a_repeat(tmp_path: Path) -> None:
    root = plant(tmp_path, {
        "gradscope/a.py": """\
            def first(values, resamples=10_000):
                return values
            """,
        "gradscope/sub/b.py": """\
            def second(values, *, seed: int = 0,
                       resamples: int = 10000):
                return values
            """,
    })
    assert repeated_defaults(root) == [
        Repeat("resamples", 10_000, ("gradscope/a.py:1 resamples", "gradscope/sub/b.py:2 resamples"))]


def test_a_dataclass_field_and_a_parameter_are_a_repeat(tmp_path: Path) -> None:
    root = plant(tmp_path, {
        "gradscope/options.py": """\
            from dataclasses import dataclass, field

            @dataclass(frozen=True)
            class Options:
                checkpoint_budget_seconds: float = 600.0
                kind: str = field(default="frobenius")
            """,
        "gradscope/run.py": """\
            def run(model, checkpoint_budget_seconds: float = 600, kind="frobenius"):
                return model
            """,
    })
    found = by_name(repeated_defaults(root))
    assert found == {("checkpoint_budget_seconds", 600.0): ("gradscope/options.py:5 checkpoint_budget_seconds",
                                                           "gradscope/run.py:1 checkpoint_budget_seconds"),
                     ("kind", "frobenius"): ("gradscope/options.py:6 kind", "gradscope/run.py:1 kind")}


def test_option_and_typer_defaults_are_read(tmp_path: Path) -> None:
    """option(default, help) in a config, a Typer parameter's `= 1024` and typer.Option(60.0, …) in cli/."""
    root = plant(tmp_path, {
        "gradscope/config.py": """\
            from dataclasses import dataclass
            from gradscope.fields import option

            @dataclass(frozen=True)
            class TextOptions:
                max_length: int = option(1024, "Tokens per row.", low=2)
                budget_seconds: float = option(default=60.0, help="Seconds.")
            """,
        "cli/accuracy.py": """\
            from typing import Annotated
            import typer
            Opt = typer.Option

            def accuracy(max_length: Annotated[int, Opt(help="Tokens per row.")] = 1024,
                         budget_seconds: float = typer.Option(60.0, "--budget-seconds")):
                pass
            """,
    })
    assert by_name(repeated_defaults(root)) == {
        ("max_length", 1024): ("gradscope/config.py:6 max_length", "cli/accuracy.py:5 max_length"),
        ("budget_seconds", 60.0): ("gradscope/config.py:7 budget_seconds", "cli/accuracy.py:6 budget_seconds")}


def test_constants_named_defaults_and_trivial_values_are_not_repeats(tmp_path: Path) -> None:
    root = plant(tmp_path, {
        "gradscope/stats.py": """\
            from typing import ClassVar

            RESAMPLES = 10_000
            LIMIT = 5000

            class Task:
                default_length: ClassVar[int] = 1024
                seed: int = 0
                labels: tuple = ()

            def first(resamples=RESAMPLES, seed=0, quiet=False, path=None, scale=1.0, sign=-1, name=""):
                return LIMIT

            def second(resamples: int = RESAMPLES, seed=0, quiet=False, path=None, scale=1.0, sign=-1, name=""):
                limit = 5000
                return limit

            def third(default_length=1024):
                return default_length
            """,
        "tests/test_stats.py": "def test(resamples=10_000): pass\ndef other(resamples=10_000): pass\n",
        "bench/stats.py": "def bench(resamples=10_000): pass\ndef other(resamples=10_000): pass\n",
    })
    assert repeated_defaults(root) == []


def test_a_distinctive_number_under_two_names_is_a_repeat(tmp_path: Path) -> None:
    """0.95 as `confidence` and `ci` is one setting; "auto" or 1000 under different names is a coincidence."""
    root = plant(tmp_path, {
        "gradscope/a.py": """\
            def interval(values, confidence=0.95, device="auto", warmup=1000):
                return values
            """,
        "reports/b.py": """\
            def summary(values, ci: float = 0.95, method="auto", resamples=1000):
                return values
            """,
    })
    assert repeated_defaults(root) == [
        Repeat("ci / confidence", 0.95, ("gradscope/a.py:1 confidence", "reports/b.py:1 ci"))]


@pytest.mark.parametrize("value, expected", [
    (0.95, True), (0.999, True), (10_000, True), (9999, True), (300_000, True), (1234, True),
    (600, False), (600.0, False), (1000, False), (0.05, False), (1e-3, False), (1024, False), (0.125, False),
    (64, False), (12, False), (60.0, False), ("percentile", False), (True, False), (0, False), (-1, False)])
def test_which_values_are_distinctive(value: object, expected: bool) -> None:
    assert distinctive(value) is expected


def test_main_prints_the_table_and_the_totals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = plant(tmp_path, {"gradscope/a.py": "def f(n=314):\n    pass\ndef g(n=314, m=314):\n    pass\n"})
    assert main([str(root)]) == 0
    out = capsys.readouterr().out
    assert "gradscope/a.py:1 n" in out and "gradscope/a.py:3 n" in out and "gradscope/a.py:3 m" in out
    assert out.rstrip().endswith("2 repeated defaults (1 under one name, 1 one value under several names), "
                                 "3 copies beyond the first")
    assert main([str(plant(tmp_path / "empty", {}))]) == 0
    assert "no literal default is written in two places" in capsys.readouterr().out


def test_the_library_repeats_no_more_defaults_than_the_baseline() -> None:
    repeats = repeated_defaults(ROOT)
    assert len(repeats) <= BASELINE, (
        f"{len(repeats)} repeated defaults, baseline {BASELINE} ({copies(repeats)} copies beyond the first): "
        f"declare the new default once (an options field or a named constant) and use it by name\n{table(repeats)}")
