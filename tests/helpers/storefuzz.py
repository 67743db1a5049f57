"""Stores, run files and sweep manifests to mutate, and how a command that read them is judged: shared by
the store tests (tests/store/) and the CLI's summarize/report hardening (tests/cli/).

Not a test module. The stores themselves are built by ``storekit.built``; this adds their legacy
versions, what the unmutated inputs read as, the hostile values the fuzz tests draw, and the checks.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from tests.helpers.fuzzkit import assert_clean, assert_untouched, invoke
from tests.helpers.hardening import FUZZ
from tests.helpers.storekit import FAST, built

SETTINGS = FUZZ  # hypothesis settings of the store fuzz tests

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, width=32)
                    | st.text(max_size=8), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c,
                                                                                              max_size=3),
                    max_leaves=6)
HOSTILE_TEXT = st.sampled_from(["{not json", "[" * 5000, "", "null", "[]", "{}", '{"core": 5}', "\u0000",
                                '{"seed": "x"}', '{"seed": 1e30}', '[{"path": 5}]', '["a", 1]', "NaN"])


def legacy(store: Path, into: Path) -> Path:
    """``store`` as gradscope wrote stores before they recorded their values: no record of its values, no
    consolidated metadata (here with every chunk present: a legacy store that has none missing)."""
    import zarr

    from gradscope.store import read_store
    with zarr.config.set({"array.write_empty_chunks": True}):
        read_store(store).to_zarr(into, zarr_format=3, consolidated=False)
    return into


def made_with_legacy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The built inputs (``storekit.built``), and a legacy version of each store (see ``legacy``)."""
    out = dict(built(tmp_path_factory.mktemp("hardening-stores") / "base"))
    d = tmp_path_factory.mktemp("legacy")
    for kind in ("accuracy", "stability", "dynamics", "summary"):
        out[f"legacy-{kind}"] = legacy(out[kind], d / out[kind].name)
    return out


def baseline_of(made: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the unmutated inputs read as: every store's values, each summary's numbers, the run's log."""
    from gradscope.store import read_store
    from gradscope.store.inputs import load_run
    out: dict[str, Any] = {"stores": {k: read_store(made[k]) for k in ("accuracy", "stability", "dynamics", "summary")},
                           "run": load_run(made["run"])}
    d = tmp_path_factory.mktemp("baseline")
    for kind in ("accuracy", "stability"):
        assert invoke(["summarize", made[kind], "-o", d / f"{kind}.zarr", *FAST]).rc == 0
        out[f"summary-{kind}"] = read_store(d / f"{kind}.zarr")
    return out


def replace_by(data: st.DataObject, path: Path, root: Path) -> str:
    """Replace ``path`` by a directory, a link (inside, outside, dangling, to /dev/zero) or a FIFO."""
    how = data.draw(st.sampled_from(["dir", "link-inside", "link-outside", "link-dangling", "link-zero", "fifo"]))
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    if how == "dir":
        path.mkdir()
    elif how == "fifo":
        os.mkfifo(path)
    else:
        target = {"link-inside": root / "zarr.json", "link-outside": Path(__file__),
                  "link-dangling": root / "nowhere", "link-zero": Path("/dev/zero")}[how]
        path.symlink_to(target)
    return f"replace {path.relative_to(root)} by {how}"


def judge(outcome: Any, what: str, before: dict[str, str], after: dict[str, str], outputs: tuple[str, ...]) -> None:
    assert_clean(outcome, what)
    assert_untouched(before, after, new_ok=outputs if outcome.rc == 0 else ())


def refused(args: list[object], *needles: str) -> str:
    """Run a command that must end with one 'error:' line (exit 2) naming every needle."""
    outcome = invoke(args)
    assert_clean(outcome, str(args))
    assert outcome.rc == 2, f"{args} ended with exit 0:\n{outcome.out[-1500:]}"
    for needle in needles:
        assert needle in outcome.err, outcome.err
    return outcome.err


def old_style(store: Path, into: Path, skip_empty: bool = False) -> Path:
    """``store`` rewritten as gradscope wrote stores before they recorded their values: no record, no
    consolidated metadata; with ``skip_empty`` zarr's default of skipping chunks that hold only the
    fill value (else a store that happened to have none)."""
    import zarr

    from gradscope.store import read_store
    ds = read_store(store)
    with warnings.catch_warnings(), zarr.config.set({"array.write_empty_chunks": not skip_empty}):
        warnings.simplefilter("ignore")
        ds.to_zarr(into, mode="w-", zarr_format=3, consolidated=False)
    return into
