"""The README's "Models from other libraries" block runs as written and prints what its comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


def test_readme_library_models_block_runs() -> None:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Models from other libraries")
    section = text[start:text.index("\n## ", start + 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1 and len(section.strip().splitlines()) <= 16  # the heading plus at most 15 lines
    expected = [m.group(1).strip() for line in blocks[0].splitlines()
                if line.startswith("print(") and (m := re.search(r"#\s*(.+)$", line))]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), {})  # noqa: S102 - our own README
    assert out.getvalue().strip().splitlines() == expected and len(expected) == 2
