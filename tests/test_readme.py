"""The README's Python API examples run as written, and print what their comments say."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def api_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python API"):text.index("## Sweeps on dask.distributed")]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_readme_python_examples_run_and_print_what_they_say() -> None:
    blocks = api_blocks()
    assert len(blocks) >= 2
    expected = [m.group(1).strip() for b in blocks for line in b.splitlines()
                if line.lstrip().startswith("print(") and (m := re.search(r"#\s*(.+)$", line))]
    assert len(expected) >= 5
    out = io.StringIO()
    namespace: dict[str, object] = {}
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            for block in blocks:
                exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    finally:
        os.chdir(cwd)
    printed = out.getvalue().strip().splitlines()
    assert printed == expected
