"""The package list in pyproject.toml covers the source tree (a missed package only fails on a fresh install)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_source_package_is_installed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapping = config.get("package-dir", {})  # none since cli/ and reports/ moved under gradscope/
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "gradscope").rglob("__init__.py")}
    on_disk |= {name for name, folder in mapping.items() if (ROOT / folder / "__init__.py").exists()}
    assert on_disk == listed, f"missing from pyproject: {on_disk - listed}; stale: {listed - on_disk}"
