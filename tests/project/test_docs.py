"""Every code block in README.md, docs/*.md and bench/README.md is checked (issue #24).

- ``python`` blocks run, a page's blocks in order in one namespace, from the repository root; when
  a ``print(...)`` line ends in a comment, the comment is what it must print.
- ``bash`` blocks and the ``$``-lines of ``console`` blocks are command lines: every ``gradscope``
  command is parsed by the CLI itself (subcommand, options, choices, types: what a typo breaks),
  every script or file a command names exists, and every pip extra is declared in pyproject.toml.
  They are parsed, not run: they train for minutes or hours, or need inputs a reader supplies.
- ``text`` and ``toml`` blocks are outputs and files, shown as they are.
- The README's test command is the one ``.ci/run`` runs, character for character.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
import types
import tomllib
from pathlib import Path

import pytest
import typer

from gradscope.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LANGUAGES = {"python", "bash", "console", "text", "toml"}
# first words a command line may start with besides gradscope (set-up, shells, the dask cluster)
OTHER_COMMANDS = {"python", "python3", "pip", "pytest", ".", "cd", "dask", "git", "export", "chromium", "ls"}


def blocks(page: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(page.read_text())]


def ids(pages: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in pages]


def test_pages_are_found_and_the_readme_is_short() -> None:
    assert len(PAGES) >= 15 and sum(len(blocks(p)) for p in PAGES) >= 25
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_every_block_says_what_it_is(page: Path) -> None:
    unnamed = [body.splitlines()[0][:60] if body.strip() else "" for lang, body in blocks(page) if lang not in LANGUAGES]
    assert not unnamed, f"{page.name}: blocks without a language of {sorted(LANGUAGES)}: {unnamed}"


PYTHON_PAGES = [p for p in PAGES if any(lang == "python" for lang, _ in blocks(p))]


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=ids(PYTHON_PAGES))
def test_python_blocks_run_and_print_what_they_say(page: Path) -> None:
    code = [body for lang, body in blocks(page) if lang == "python"]
    if "import transformers" in "".join(code) or "transformers," in "".join(code):
        pytest.importorskip("transformers")
    expected = [m.group(1).strip() for body in code for line in body.splitlines()
                if line.lstrip().startswith("print(") and (m := re.search(r"#\s*(.+)$", line))]
    module = types.ModuleType("gradscope_docs_page")  # a real module: dataclasses look their class's module up
    out, cwd = io.StringIO(), os.getcwd()
    sys.modules[module.__name__] = module
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            for body in code:
                exec(compile(body, str(page), "exec"), module.__dict__)  # noqa: S102 - our own docs
    finally:
        os.chdir(cwd)
        del sys.modules[module.__name__]
    if expected:  # a page whose prints carry their outputs as comments
        assert out.getvalue().strip().splitlines() == expected


def command_lines(lang: str, body: str) -> list[list[str]]:
    """The commands of a bash block, or of a console block's ``$`` lines, as argument lists."""
    if lang == "console":
        text = "\n".join(line[2:] for line in body.splitlines() if line.startswith("$ "))
    else:
        text = body
    text = text.replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in words + ["&&"]:
            if word in ("&&", "||", ";", "|"):
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
    return commands


def parse_gradscope(args: list[str]) -> None:
    """Parse a command line the way ``gradscope`` does, without running it."""
    group = typer.main.get_command(app)
    command, name, rest = group, "gradscope", args
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):
        name, rest = rest[0], rest[1:]
        assert name in command.commands, f"gradscope has no command {name!r}"
        command = command.commands[name]
    try:
        ctx = command.make_context(name, list(rest))
    except Exception as exc:  # a parse error: the docs drifted from the CLI
        if type(exc).__name__ == "Exit":  # --help
            return
        raise AssertionError(f"`gradscope {' '.join(args)}`: {exc}") from None
    for param in command.get_params(ctx):  # a number flag passes text that is no number on, for its dataclass
        value = ctx.params.get(param.name or "")
        assert not (param.metavar in ("<int>", "<float>") and isinstance(value, str)), \
            f"`gradscope {' '.join(args)}`: {param.opts[0]} {value!r} is no number"


def check_command(words: list[str], extras: set[str]) -> None:
    while re.fullmatch(r"[A-Z_]+=\S*", words[0]) and len(words) > 1:  # NAME=value before a command
        words = words[1:]
    first = words[0]
    if first == "gradscope":
        parse_gradscope(words[1:])
    elif first in ("python", "python3") and len(words) > 1 and not words[1].startswith("-"):
        assert (ROOT / words[1]).is_file(), f"`{' '.join(words)}`: no file {words[1]}"
    elif first == "pip":
        for word in words[2:]:
            if m := re.fullmatch(r"\.\[([\w,-]+)\]", word):
                missing = set(m.group(1).split(",")) - extras
                assert not missing, f"`{' '.join(words)}`: pyproject.toml declares no extra {sorted(missing)}"
    else:
        assert first in OTHER_COMMANDS, f"`{' '.join(words)}`: an unexpected command in the docs"


COMMAND_PAGES = [p for p in PAGES if any(lang in ("bash", "console") for lang, _ in blocks(p))]


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=ids(COMMAND_PAGES))
def test_command_lines_parse_against_the_cli(page: Path) -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    checked = 0
    for lang, body in blocks(page):
        if lang in ("bash", "console"):
            for words in command_lines(lang, body):
                check_command(words, extras)
                checked += 1
    assert checked


def test_a_drifted_command_is_caught() -> None:
    """The check fails on an option the CLI does not have, a command it does not have, or a value of
    the wrong type (it can fail)."""
    parse_gradscope(["stability", "run", "--target-freq", "rare", "-o", "s.zarr"])
    for bad in (["stability", "run", "--target-group", "rare"], ["dynamics", "run", "--no-such-flag"],
                ["stabilty", "run"], ["accuracy", "run", "--batch-size", "many"]):
        with pytest.raises(AssertionError):
            parse_gradscope(bad)


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    setup = [body for lang, body in blocks(ROOT / "README.md") if lang == "bash"][0].splitlines()
    assert len(setup) == 2, "the README starts with exactly two set-up commands"
    ci = re.search(r"^TEST_CMD='(.*)'$", (ROOT / ".ci" / "run").read_text(), flags=re.M)
    assert ci is not None and ci.group(1) == setup[1]
    assert setup[0].startswith("python3 -m venv .venv") and "sample_checkpoints/" in setup[0]


def test_the_product_cites_its_own_definitions_page() -> None:
    """Help texts, tables, code and docs cite docs/definitions.md's sections, never the developers' SPEC outside
    the repository; every cited section exists; the README names no path outside the repository."""
    page = (ROOT / "docs" / "definitions.md").read_text()
    sections = set(re.findall(r"^## (\d)\. ", page, flags=re.M))
    assert sections == {str(n) for n in range(1, 10)}
    files = [p for d in ("gradscope", "cli", "reports", "docs") for p in (ROOT / d).rglob("*")
             if p.suffix in (".py", ".md")] + [ROOT / "README.md"]
    cited: set[str] = set()
    for path in files:
        text = path.read_text()
        assert not re.search(r"SPEC §|SPEC\.md", text), f"{path.relative_to(ROOT)} cites SPEC"
        cited |= set(re.findall(r"definitions(?:\.md)?\]?(?:\([^)]*\))? §(\d)", text))
        cited |= set(re.findall(r"\[definitions §(\d)\]", text))
    assert cited and cited <= sections
    readme = (ROOT / "README.md").read_text()
    assert "../" not in readme and "/work/" not in readme
