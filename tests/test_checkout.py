"""gradscope.cli and gradscope.reports from a source checkout (``gradscope.checkout``): a script run from the
repository root, where the checkout's gradscope/ shadows an installed copy, finds them in the top-level
folders, and the checkout's finder wins over another checkout's editable finder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_script_run_from_the_checkout_finds_cli_and_reports() -> None:
    """From the repository root the checkout's gradscope/ comes first on sys.path and shadows an
    installed copy (a plain `pip install .` puts cli/ inside the installed package only): its finder
    (gradscope/checkout.py) gives gradscope.cli and gradscope.reports from the top-level folders."""
    code = "import gradscope.cli.app as a, gradscope.reports.build as b; print(a.__file__, b.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    app, build = (Path(p) for p in out.stdout.split())
    assert app == ROOT / "cli" / "app.py" and build == ROOT / "reports" / "build.py"


def test_the_checkout_finder_comes_before_another_checkouts_editable_finder(tmp_path: Path) -> None:
    """Found by the part-3 helper: run from one checkout whose venv has an editable install of another,
    gradscope came from this checkout but gradscope.cli from the other (the finder was appended after
    setuptools' editable finder). A finder that maps gradscope.cli elsewhere, installed first, must
    not win."""
    other = tmp_path / "other" / "cli"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("WHERE = 'other'\n")
    code = ("import importlib.machinery, importlib.util, sys\n"
            "class Other:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'gradscope.cli':\n"
            f"            return importlib.util.spec_from_file_location(name, {str(other / '__init__.py')!r}, "
            f"submodule_search_locations=[{str(other)!r}])\n"
            "sys.meta_path.insert(0, Other())\n"
            "import gradscope.cli\n"
            "print(gradscope.cli.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == ROOT / "cli" / "__init__.py"
