"""The package list in pyproject.toml covers the source tree (a missed package only fails on a fresh
install), and the design card's top-level cli/ and reports/ install as gradscope.cli and
gradscope.reports, never as bare `cli` or `reports` modules (issue #39 part 4). How a script run from the
checkout finds them is tested in tests/test_checkout.py."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = {"gradscope.cli": "cli", "gradscope.reports": "reports"}  # package → its folder beside gradscope/


def test_every_source_package_is_installed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert config["package-dir"] == TOP  # only these two live outside gradscope/
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "gradscope").rglob("__init__.py")}
    for package, folder in TOP.items():
        assert not (ROOT / "gradscope" / folder).exists(), f"gradscope/{folder} and {folder}/ both exist"
        on_disk |= {".".join([package, *p.parent.relative_to(ROOT / folder).parts]) for p in (ROOT / folder).rglob("__init__.py")}
    assert on_disk == listed, f"missing from pyproject: {on_disk - listed}; stale: {listed - on_disk}"


def test_cli_and_reports_import_only_as_gradscope_packages(tmp_path: Path) -> None:
    """Away from the checkout (as a user's script runs), gradscope.cli and gradscope.reports import and
    bare cli / reports do not: the install (editable or not) put nothing generic on sys.path."""
    code = ("import importlib.util, gradscope.cli.app, gradscope.reports.build as b; "
            "assert importlib.util.find_spec('cli') is None and importlib.util.find_spec('reports') is None; "
            "print(gradscope.cli.app.__file__, b.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    app, build = (Path(p) for p in out.stdout.split())
    assert app.parent.name == "cli" and build.parent.name == "reports"
