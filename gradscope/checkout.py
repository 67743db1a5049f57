"""gradscope.cli and gradscope.reports in a source checkout.

The design card puts the Typer CLI in ``cli/`` and the report renderer in ``reports/``, at the top level
beside ``gradscope/``. Installed, they are inside the package (pyproject's ``package-dir``: an editable
install maps them with setuptools' own finder). Where Python imports ``gradscope`` straight from a
checkout instead (a script or notebook run from the repository root, whose working directory comes
first on ``sys.path`` and shadows the installed copy), :func:`use_checkout_folders` adds a finder for
exactly those two names, so ``import gradscope.cli`` works there too. Nothing else is mapped, and no bare
``cli`` or ``reports`` module is ever importable through it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

FOLDERS = ("cli", "reports")


class CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds ``gradscope.cli`` and ``gradscope.reports`` in a checkout's top-level folders (their
    submodules then come from the package's ``__path__`` as usual)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        head, _, name = fullname.partition(".")
        if head != "gradscope" or name not in FOLDERS:
            return None
        folder = self.root / name
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def use_checkout_folders() -> None:
    """Install :class:`CheckoutFinder` when this ``gradscope`` is a checkout's (no ``cli``/``reports``
    inside it, both beside it with a ``pyproject.toml``), once."""
    here = Path(__file__).resolve().parent
    root = here.parent
    if any((here / f).is_dir() for f in FOLDERS) or not (root / "pyproject.toml").is_file():
        return
    if not all((root / f / "__init__.py").is_file() for f in FOLDERS):
        return
    if not any(isinstance(f, CheckoutFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, CheckoutFinder(root))  # before an editable install's finder of another checkout
