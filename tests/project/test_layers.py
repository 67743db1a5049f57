"""The package's layers point one way: every package and top-level module of gradscope has a rank of
its own, and a module imports only from its own package or lower ranks (docs/architecture.md draws the
graph). reports read data only through store; the library never imports typer or plotly; no import
cycles, not even through `if TYPE_CHECKING:` imports, and no function-level imports of gradscope modules
in the library."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# cli/ and reports/ sit at the top level (the design card) and install as gradscope.cli and gradscope.reports
PACKAGES = {"gradscope": ROOT / "gradscope", "gradscope.cli": ROOT / "cli", "gradscope.reports": ROOT / "reports"}
# layer rank, one per package: a module may import only from its own layer or lower ones
RANK = {"cli": 16, "reports": 15, "workflows": 14, "rates": 13, "store": 12, "train": 11, "files": 10, "analysis": 9, "presets": 8,
        "config": 7, "tasks": 6, "corpus": 5, "models": 4, "guard": 3, "fields": 2, "version": 1, "errors": 0,
        "checkout": -1}  # checkout: how gradscope.cli and gradscope.reports are found in a source checkout


# packages whose ranks differ but which import neither each other: both stand on files/ alone
SIBLINGS = [("store", "train")]

PACKAGE_NAMES: set[str] = set()


def modules() -> dict[str, ast.Module]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            name = ".".join([package, *rel]).removesuffix(".__init__")
            if path.name == "__init__.py":
                PACKAGE_NAMES.add(name)
            found[name] = ast.parse(path.read_text())
    assert {"gradscope.cli.app", "gradscope.reports.build", "gradscope.workflows.stability"} <= set(found)
    return found


def imports(tree: ast.Module, name: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import in the tree; an import in a
    module-level ``if`` (``if TYPE_CHECKING:`` too) is at module level."""
    top = {id(c) for m in tree.body for c in (ast.walk(m) if isinstance(m, ast.If) else [m])}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level − 1 more
                parts = name.split(".") if name in PACKAGE_NAMES else name.split(".")[:-1]
                parent = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            targets = [base]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for t in targets:
            out.append((t, node.lineno, id(node) in top))
    return out


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "gradscope" and len(parts) > 1 else None


def test_every_package_has_a_rank_of_its_own() -> None:
    """Two packages of one rank could import each other (train and store once did, through a cycle
    the check could not see); a package without a rank would escape the check."""
    assert len(set(RANK.values())) == len(RANK)
    found = {layer(name) for name in modules()} - {None}
    assert found == set(RANK), f"unranked: {sorted(found - set(RANK))}; ranked but gone: {sorted(set(RANK) - found)}"


def test_layers_point_one_way() -> None:
    bad = []
    for name, tree in modules().items():
        me = layer(name)
        for target, line, _ in imports(tree, name):
            other = layer(target)
            if me is not None and other is not None and other != me and RANK[other] > RANK[me]:
                bad.append(f"{name}:{line} imports {target}")
            if (me, other) in SIBLINGS or (other, me) in SIBLINGS:
                bad.append(f"{name}:{line} imports {target}: {me} and {other} share files/ and import neither each other")
            # (and the report's options, declared torch-free with the other commands' options, and the fields' own
            # helpers they are made with: settings, not data)
            if me == "reports" and other not in (None, "reports", "store", "files", "errors", "version") \
                    and target not in ("gradscope.workflows.study.options", "gradscope.fields"):
                bad.append(f"{name}:{line} (reports) imports {target}: reports read data through store only "
                           f"(and write files through files/)")
    assert not bad, "\n".join(bad)


def test_library_never_imports_typer_or_plotly_and_has_no_hidden_imports() -> None:
    bad = []
    for name, tree in modules().items():
        if layer(name) in ("cli", "reports"):
            continue
        for target, line, at_top in imports(tree, name):
            if target.split(".")[0] in ("typer", "plotly", "click", "rich"):
                bad.append(f"{name}:{line} imports {target}")
            if target.startswith("gradscope") and not at_top:
                bad.append(f"{name}:{line} imports {target} inside a function")
    assert not bad, "\n".join(bad)


def import_graph(mods: dict[str, ast.Module]) -> dict[str, set[str]]:
    """module → the modules of ``mods`` it imports at module level, ``if TYPE_CHECKING:`` imports included."""
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, tree in mods.items():
        for target, _, at_top in imports(tree, name):
            # a submodule importing its own package (whose __init__ imports it) is not a cycle through them
            if at_top and target in mods and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles of ``graph`` (one per back edge of a depth-first walk), each from a module back to it."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_import_cycles() -> None:
    """No cycle, not even one closed by an ``if TYPE_CHECKING:`` import: such a cycle never runs, but it
    ties its modules together for a reader and a type checker, and the first import needed at run
    time makes it a real one."""
    cycles = find_cycles(import_graph(modules()))
    assert not cycles, "\n".join(" → ".join(c) for c in cycles)


# which packages may import each heavy or user-interface library at all (any level); docs/architecture.md says the same
MAY_IMPORT = {"xarray": {"store", "workflows", "reports", "cli"}, "zarr": {"store"}, "plotly": {"reports"},
              "typer": {"cli"}, "rich": {"cli"},
              "torch": {"cli", "workflows", "rates", "store", "train", "files", "analysis", "tasks", "models", "guard"}}


def test_each_library_is_imported_only_by_the_packages_the_docs_name() -> None:
    bad = []
    for name, tree in modules().items():
        me = layer(name)
        for target, line, _ in imports(tree, name):
            lib = target.split(".")[0]
            if lib in MAY_IMPORT and me not in MAY_IMPORT[lib]:
                bad.append(f"{name}:{line} imports {target}; only {sorted(MAY_IMPORT[lib])} may")
    assert not bad, "\n".join(bad)
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for lib, packages in MAY_IMPORT.items():  # the bullet "- **lib**: …" with its continuation lines
        bullet = re.search(rf"^- \*\*{lib}\*\*(.*\n(?:  .*\n)*)", doc, flags=re.M)
        assert bullet, f"docs/architecture.md has no line for {lib}"
        named = set(re.findall(r"`([a-z_]+)(?:/|\.py)`", bullet[1]))
        assert named == packages, f"docs/architecture.md names {sorted(named)} for {lib}; the code: {sorted(packages)}"


def test_the_docs_import_graph_is_the_tests_ranks() -> None:
    """docs/architecture.md's graph lists every package with the rank this test gives it, no more."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    block = doc.split("## The import graph", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    drawn = {m[2].removesuffix("/").removesuffix(".py"): int(m[1])
             for m in re.finditer(r"^\s*(-?\d+)\s+(([a-z_]+)(?:/|\.py))\s", block, flags=re.M)}
    assert drawn == RANK


def test_the_checks_can_fail() -> None:
    """The cycle and layer checks see a planted violation."""
    tree = ast.parse("from gradscope.workflows.stability import run_stability\n")
    assert [t for t, _, _ in imports(tree, "gradscope.store.x")] == ["gradscope.workflows.stability"]
    assert RANK[layer("gradscope.workflows.stability")] > RANK[layer("gradscope.store.x")]
    sideways = ast.parse("from gradscope.train.loop import train\n")
    assert [t for t, _, _ in imports(sideways, "gradscope.store.x")] == ["gradscope.train.loop"]
    assert RANK[layer("gradscope.train.loop")] != RANK[layer("gradscope.store.x")]  # one of them is upward
    nested = ast.parse("def f():\n    from gradscope.models import SeqModel\n")
    assert [at_top for _, _, at_top in imports(nested, "gradscope.analysis.x")] == [False]
    # a cycle closed by a type checker's import is still a cycle
    planted = {"gradscope.tasks.a": ast.parse("from gradscope.tasks.b import B\n"),
               "gradscope.tasks.b": ast.parse("from typing import TYPE_CHECKING\n\n"
                                              "if TYPE_CHECKING:\n    from gradscope.tasks.a import A\n")}
    assert find_cycles(import_graph(planted)) == [["gradscope.tasks.a", "gradscope.tasks.b", "gradscope.tasks.a"]]
    del planted["gradscope.tasks.b"].body[1]  # without the type-only import: no cycle
    assert find_cycles(import_graph(planted)) == []
