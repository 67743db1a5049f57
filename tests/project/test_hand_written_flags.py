"""Each option is declared once, on its options dataclass, and the CLI generates its flag (cli/generated.py). What
a command writes by hand is only what exists on the command line alone: its argument (what it reads), where it
writes (``-o``, and summarize's ``--csv``), ``--overwrite`` and ``-q``. This test reads cli/*.py and holds it so."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND_LINE_ONLY = {"out", "overwrite", "quiet", "csv"}  # where a command writes, and how it talks


def hand_written(source: str) -> list[tuple[str, str, str]]:
    """(function, parameter, "argument" or "option") for each ``Annotated[…, typer.Option/Opt/typer.Argument(…)]``
    parameter written in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef):
            continue
        for arg in node.args.args + node.args.kwonlyargs:
            if arg.annotation is None:
                continue
            for call in ast.walk(arg.annotation):
                if isinstance(call, ast.Call):
                    name = ast.unparse(call.func)
                    if name in ("typer.Argument", "Arg"):
                        found.append((node.name, arg.arg, "argument"))
                    elif name in ("typer.Option", "Opt"):
                        found.append((node.name, arg.arg, "option"))
    return found


def test_the_finder_sees_options_and_arguments() -> None:
    code = ("def f(a: Annotated[Path, typer.Argument(help='x')], b: Annotated[int, Opt('--b')] = 1,\n"
            "      c: Annotated[int, typer.Option()] = 2, d: int = 3) -> None: ...\n")
    assert hand_written(code) == [("f", "a", "argument"), ("f", "b", "option"), ("f", "c", "option")]


def test_only_command_line_flags_are_written_by_hand() -> None:
    written = [(path.name, *p) for path in sorted((ROOT / "cli").glob("*.py")) for p in hand_written(path.read_text())]
    options = [(f, fn, name) for f, fn, name, kind in written if kind == "option"]
    assert options, "the finder found no option at all: it is broken"
    others = [f"{f}: {fn}({name})" for f, fn, name in options if name not in COMMAND_LINE_ONLY]
    assert not others, ("options written by hand that belong on an options dataclass (declare them with "
                        "gradscope.fields.option; cli/generated.py makes the flag):\n" + "\n".join(others))
    arguments = [name for _, _, name, kind in written if kind == "argument"]
    assert len(arguments) == len(set((f, fn) for f, fn, _, kind in written if kind == "argument")), \
        "a command with two arguments"
