"""The tests mirror the package: every module of gradscope/, cli/ and reports/ has its own test file,
``tests/<package path>/test_<module>.py`` (gradscope/store/io.py → tests/store/test_io.py, gradscope/guard.py
→ tests/test_guard.py, cli/train.py → tests/cli/test_train.py, reports/build.py → tests/reports/test_build.py),
or an entry in ALLOWLIST below that says why not. A package's ``__init__.py`` is its folder's, not a module.

The allowlist is kept true: an entry whose module is gone, or whose module now has its own test file,
fails here, and so does a reason naming a test file that does not exist. Run
``python tests/project/test_mirror.py`` for the counts.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"gradscope": Path("tests"), "cli": Path("tests/cli"), "reports": Path("tests/reports")}  # code → its tests

# Modules without logic of their own: declarations, constants and display only.
NO_LOGIC = {
    "gradscope/errors.py": "the exception and warning types, raised and caught by every refusal test",
    "gradscope/version.py": "the version string",
    "gradscope/workflows/families/evaluation.py": "declarations: what a family's own evaluation provides",
    "cli/progress.py": "display only: the progress bars (-q in the tests)",
}

# Modules tested only through a contract that every unit of their kind meets: none. The cores, the family
# declarations and the adapters' shared pieces are run by tests/project/test_contracts.py and the adapter tests,
# and also have their own unit tests (tests/models/test_elman.py, tests/models/adapters/test_base.py, …).
CONTRACT: dict[str, str] = {}

# Modules with logic whose tests live in files that do not mirror them yet: where they are tested.
NOT_YET_MIRRORED: dict[str, str] = {}

ALLOWLIST = {**NO_LOGIC, **CONTRACT, **NOT_YET_MIRRORED}


def mirrors() -> dict[str, Path]:
    """Every module (its path from the repository root) → the test file that mirrors it."""
    found = {}
    for package, tests in PACKAGES.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT / package)
            if path.name != "__init__.py":
                found[str(path.relative_to(ROOT))] = tests.joinpath(*rel.parts[:-1]) / f"test_{path.stem}.py"
    return found


def test_every_module_has_its_own_test_file_or_says_why_not() -> None:
    missing = [f"{module} (expected {test})" for module, test in mirrors().items()
               if not (ROOT / test).is_file() and module not in ALLOWLIST]
    assert not missing, "modules with neither their own test file nor an ALLOWLIST entry:\n" + "\n".join(missing)


def test_the_allowlist_is_true() -> None:
    modules = mirrors()
    assert len(ALLOWLIST) == len(NO_LOGIC) + len(CONTRACT) + len(NOT_YET_MIRRORED), "a module listed twice"
    gone = [m for m in ALLOWLIST if m not in modules]
    assert not gone, f"allowlisted modules that no longer exist: {gone}"
    mirrored = [f"{m} ({modules[m]})" for m in ALLOWLIST if (ROOT / modules[m]).is_file()]
    assert not mirrored, f"allowlisted modules that now have their own test file (drop them from ALLOWLIST): {mirrored}"
    named = {p for reason in ALLOWLIST.values() for p in re.findall(r"tests/[\w/]+\.py", reason)}
    assert not [p for p in named if not (ROOT / p).is_file()], f"reasons name missing test files: " \
        f"{sorted(p for p in named if not (ROOT / p).is_file())}"
    assert all(reason.strip() for reason in ALLOWLIST.values())


if __name__ == "__main__":
    table = mirrors()
    own = sum((ROOT / test).is_file() for test in table.values())
    print(f"{own} of {len(table)} modules have their own test file; allowlisted: {len(NO_LOGIC)} without logic, "
          f"{len(CONTRACT)} through a contract, {len(NOT_YET_MIRRORED)} tested elsewhere, not yet mirrored")
