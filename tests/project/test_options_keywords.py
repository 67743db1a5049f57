"""Nothing builds an options dataclass positionally (issue #39, part 2): a field inserted into
``StabilityOptions`` would otherwise shift every later argument silently. The source of the
library, the CLI, the reports, the benchmarks, the experiments and the tests is scanned (ast) for a
call of any class named ``*Options`` with a positional (or ``*``-unpacked) argument, and every such
class is a keyword-only dataclass, so a new positional call fails at once as well."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("gradscope", "cli", "reports", "bench", "experiments", "tests")
# where the options classes live, as they install (cli/ and reports/ are gradscope.cli and gradscope.reports)
PACKAGES = {"gradscope": "gradscope", "cli": "gradscope.cli", "reports": "gradscope.reports"}


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def positional_calls(source: str, filename: str = "<source>") -> list[str]:
    """'file:line: Name' for every call of a ``*Options`` class with a positional argument in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call) and (_called(node) or "").endswith("Options") and node.args:
            found.append(f"{filename}:{node.lineno}: {_called(node)}")
    return found


def sources() -> list[Path]:
    paths = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(paths) > 100 and ROOT / "cli" / "stability.py" in paths  # the scan sees the tree it means to
    return paths


def options_classes() -> list[type]:
    """Every class named ``*Options`` defined in gradscope/, cli/ and reports/, imported."""
    found = []
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            names = [n.name for n in ast.parse(path.read_text()).body
                     if isinstance(n, ast.ClassDef) and n.name.endswith("Options")]
            if names:
                rel = path.relative_to(ROOT / folder).with_suffix("").parts
                module = importlib.import_module(".".join([package, *rel]).removesuffix(".__init__"))
                found += [getattr(module, n) for n in names]
    return found


def test_the_settings_configs_are_keyword_only() -> None:
    """train's settings are its run config's fields (issue #39): TaskConfig('reverse', 8) meant vocab_size 8 while
    length kept its default; a config is built by naming its fields (found in review: not enforced)."""
    from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig

    for cls in (ModelConfig, RunConfig, TaskConfig, TrainConfig):
        assert all(f.kw_only for f in dataclasses.fields(cls)), cls
    with pytest.raises(TypeError):
        TaskConfig("reverse", 8)  # type: ignore[misc]


def test_the_scan_finds_a_positional_call() -> None:
    """The detector itself: positional, starred and attribute calls are found; keywords alone are not."""
    text = ("a = StabilityOptions((), (), 3)\nb = stab.StabilityOptions(*args)\n"
            "c = AccuracyOptions(bins=4)\nd = ReportOptions(**kw)\ne = Other(1)\n")
    assert positional_calls(text) == ["<source>:1: StabilityOptions", "<source>:2: StabilityOptions"]


def test_no_options_dataclass_is_built_positionally() -> None:
    found = [hit for p in sources() for hit in positional_calls(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "options built positionally (name every field):\n" + "\n".join(found)


def test_every_options_class_is_keyword_only() -> None:
    classes = options_classes()
    names = {c.__name__ for c in classes}
    assert {"StabilityOptions", "DynamicsOptions", "AccuracyOptions", "ReportOptions"} <= names
    for cls in classes:
        assert dataclasses.is_dataclass(cls), cls
        positional = [f.name for f in dataclasses.fields(cls) if not f.kw_only]
        assert not positional, f"{cls.__name__}: fields {positional} may be given positionally; use kw_only=True"
        with pytest.raises(TypeError):
            cls(*[f.default for f in dataclasses.fields(cls)][:1])


@pytest.mark.parametrize("command, args, build", [
    ("stability", ["--sv", "0"], lambda: importlib.import_module("gradscope.workflows.stability").StabilityOptions(sv=0)),
    ("accuracy", ["--batch-size", "0"],
     lambda: importlib.import_module("gradscope.workflows.accuracy").AccuracyOptions(batch_size=0)),
    ("dynamics", ["--sv", "0"], lambda: importlib.import_module("gradscope.workflows.dynamics").DynamicsOptions(sv=0)),
])
def test_an_option_is_checked_once_in_its_dataclass(runner, tmp_path: Path, command: str, args: list[str],
                                                    build) -> None:  # noqa: ANN001
    """The CLI refuses a bad option with the options dataclass's own message (its flag for the field
    name), not a second check of its own written in the command's body."""
    from gradscope.errors import GradscopeError

    with pytest.raises(GradscopeError) as caught:
        build()
    sample = ROOT / "sample_checkpoints" / "gru-sinusoidal-s1" / "step-0006000.pt"
    result = runner.invoke(importlib.import_module("gradscope.cli.app").app,
                           [command, str(sample), *args, "-q", "-o", str(tmp_path / "out.zarr")])
    assert result.exit_code == 2
    assert result.stderr == f"error: --{str(caught.value).replace('_', '-', str(caught.value).index(':'))}\n"
    assert not (tmp_path / "out.zarr").exists()
