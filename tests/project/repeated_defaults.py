"""Literal defaults written in more than one place in the library (gradscope/, cli/, reports/).

Each option should be declared once: a default typed as a literal in two places drifts apart the day
one copy changes. This script reads the source with ``ast`` only (it imports nothing of gradscope)
and reports two kinds of repeat:

- **same name**: one parameter or field name with one literal default in two or more places
  (``resamples = 10_000`` in a dozen functions);
- **same value**: one *distinctive* number (see :func:`distinctive`) as the default of two or more
  different names (``confidence = 0.95`` beside ``ci = 0.95``). Its places are also counted in the
  same-name repeats of each of those names: the two kinds are separate findings.

A default is the literal value of
- a function parameter, positional or keyword-only (Typer commands' ``... = 600.0`` included), or
  the first argument / ``default=`` of ``option(…)``, ``field(…)``, ``typer.Option(…)``, ``Opt(…)`` or
  ``typer.Argument(…)`` written as the default;
- a class-level annotated field (``x: int = 10_000``, ``x: int = option(10_000, "…")``); ``ClassVar``
  attributes are constants, not defaults.

A literal is a number, a string, a negated number or a tuple of those. A module- or class-level
constant (``MAX_POINTS = 10_000``) is the one declaration, not a repeat, and a constant's *name* used
as a default (``resamples: int = DEFAULT_RESAMPLES``) is what the fix looks like, so neither is counted.

Ignored as trivial (they say "off", "none", "one" or "empty", not a chosen setting): ``IGNORED`` —
None, True, False, 0, 1, -1, 0.0, 1.0, -1.0, "" and ().

Run ``python tests/project/repeated_defaults.py`` for the table and the totals.
"""

from __future__ import annotations

import ast
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("gradscope", "cli", "reports")  # tests/ and bench/ may repeat what they pin
IGNORED: tuple[object, ...] = (None, True, False, 0, 1, -1, 0.0, 1.0, -1.0, "", ())
# calls whose first positional argument (or default=) is the default when written as one
DEFAULT_CALLS = {"option", "field", "Option", "Opt", "Argument"}


@dataclass(frozen=True)
class Repeat:
    """One literal default found in two or more places. ``name``: the parameter or field name, or the
    names joined by " / " for a value shared by different names; ``places``: ``file:line name``."""

    name: str
    value: object
    places: tuple[str, ...]


@dataclass(frozen=True)
class Default:
    name: str
    value: object
    path: str
    line: int

    @property
    def place(self) -> str:
        return f"{self.path}:{self.line} {self.name}"


def trivial(value: object) -> bool:
    return any(type(value) is type(t) and value == t for t in IGNORED) or isinstance(value, bool) or value is None


def distinctive(value: object) -> bool:
    """Whether one number under two different names is likely one setting typed twice rather than a
    coincidence. Not distinctive: strings ("auto", "none" and "default" are the choice of many unrelated
    settings; a string repeated under one name is still reported), powers of two (64, 1024: sizes of
    many unrelated things), whole numbers below 100 (small counts), and round numbers below 10,000 —
    one significant digit, such as 0.05, 0.1, 1e-3, 100, 600 or 1000, which unrelated settings pick
    alike. Distinctive: 0.95, 0.999, 9999, 10_000, 300_000."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    size = abs(float(value))
    if not math.isfinite(size) or size == 0 or math.log2(size).is_integer():
        return False
    if float(size).is_integer() and size < 100:
        return False
    mantissa = size / 10 ** math.floor(math.log10(size))
    round_number = abs(mantissa - round(mantissa)) < 1e-9
    return not round_number or size >= 10_000


def literal(node: ast.expr | None) -> tuple[bool, object]:
    """(is a literal, its value) for a default expression; calls in DEFAULT_CALLS are unwrapped."""
    if node is None:
        return False, None
    if isinstance(node, ast.Call):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if called not in DEFAULT_CALLS:
            return False, None
        given = [k.value for k in node.keywords if k.arg == "default"]
        inner = given[0] if given else node.args[0] if node.args else None
        if inner is None or isinstance(inner, ast.Call):
            return False, None
        return literal(inner)
    if not isinstance(node, (ast.Constant, ast.UnaryOp, ast.Tuple)):
        return False, None
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return False, None
    if isinstance(value, bytes) or value is Ellipsis:
        return False, None
    return True, value


def class_var(annotation: ast.expr) -> bool:
    base = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    name = base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else ""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a string annotation
        name = annotation.value.split("[")[0].rsplit(".", 1)[-1]
    return name == "ClassVar"


def defaults_in(tree: ast.Module, path: str) -> list[Default]:
    """Every literal, non-trivial default of a function parameter or class field in one module."""
    found: list[tuple[str, ast.expr | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = [*a.posonlyargs, *a.args]
            for arg, default in zip(positional[len(positional) - len(a.defaults):], a.defaults):
                found.append((arg.arg, default, default.lineno))
            for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults):
                if kw_default is not None:
                    found.append((arg.arg, kw_default, kw_default.lineno))
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                        and stmt.value is not None and not class_var(stmt.annotation):
                    found.append((stmt.target.id, stmt.value, stmt.lineno))
    out = []
    for name, expr, line in found:
        ok, value = literal(expr)
        if ok and not trivial(value):
            out.append(Default(name, value, path, line))
    return out


def library_defaults(root: Path) -> list[Default]:
    """Every literal default in the library's packages under ``root``, in file and line order."""
    out: list[Default] = []
    for package in LIBRARY:
        for file in sorted((root / package).rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            found = defaults_in(ast.parse(file.read_text(encoding="utf-8"), filename=rel), rel)
            out.extend(sorted(found, key=lambda d: d.line))
    return out


def key(value: object) -> tuple[str, object]:
    """A grouping key: 600 and 600.0 are one default, "600" another."""
    kind = "number" if isinstance(value, (int, float)) else type(value).__name__
    return kind, value


def repeated_defaults(root: Path = ROOT) -> list[Repeat]:
    """Same-name repeats (most places first), then same-value repeats under different names."""
    defaults = library_defaults(root)
    by_name: dict[tuple[str, tuple[str, object]], list[Default]] = defaultdict(list)
    by_value: dict[tuple[str, object], list[Default]] = defaultdict(list)
    for d in defaults:
        by_name[(d.name, key(d.value))].append(d)
        if distinctive(d.value):
            by_value[key(d.value)].append(d)
    same_name = [Repeat(name, ds[0].value, tuple(d.place for d in ds))
                 for (name, _), ds in by_name.items() if len(ds) >= 2]
    same_value = []
    for ds in by_value.values():
        names = sorted({d.name for d in ds})
        if len(names) >= 2:
            same_value.append(Repeat(" / ".join(names), ds[0].value, tuple(d.place for d in ds)))
    return sorted(same_name, key=most_places) + sorted(same_value, key=most_places)


def most_places(repeat: Repeat) -> tuple[int, str, str]:
    return -len(repeat.places), repeat.name, repr(repeat.value)


def copies(repeats: list[Repeat]) -> int:
    """Places beyond the first of each repeat: what one constant per repeat would remove."""
    return sum(len(r.places) - 1 for r in repeats)


def table(repeats: list[Repeat]) -> str:
    if not repeats:
        return "no literal default is written in two places"
    width = max(len(r.name) for r in repeats)
    vwidth = max(len(repr(r.value)) for r in repeats)
    lines = [f"{'name':<{width}}  {'value':<{vwidth}}  places", f"{'-' * width}  {'-' * vwidth}  ------"]
    for r in repeats:
        lines.append(f"{r.name:<{width}}  {r.value!r:<{vwidth}}  {len(r.places)}")
        lines.extend(f"{'':<{width}}  {'':<{vwidth}}    {p}" for p in r.places)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the repeats of the tree at argv[0] (default: this checkout) and the totals."""
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0]) if argv else ROOT
    repeats = repeated_defaults(root)
    same_value = sum(" / " in r.name for r in repeats)
    print(table(repeats))
    print()
    print(f"{len(repeats)} repeated defaults ({len(repeats) - same_value} under one name, {same_value} one value "
          f"under several names), {copies(repeats)} copies beyond the first")
    return 0


if __name__ == "__main__":
    sys.exit(main())
