"""What every command shares: an existing, misplaced or late-appearing output store is refused before any
work (stability and dynamics), leaving what was there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.fuzzkit import invoke, leftovers, snapshot
from tests.helpers.hardening import FAST
from tests.workflows.test_common import runs  # noqa: F401 - the fixture


def test_an_existing_store_is_refused_before_any_work(runs: dict[str, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from gradscope.workflows import stability as workflow
    calls = []
    real = workflow.probe_stability
    monkeypatch.setattr(workflow, "probe_stability", lambda *a, **k: calls.append(1) or real(*a, **k))
    (tmp_path / "s.zarr").mkdir()
    (tmp_path / "s.zarr" / "mine").write_text("keep")
    (tmp_path / "file.zarr").write_text("a file")
    before = snapshot(tmp_path)
    for out, extra, message in (("s.zarr", (), "already exists"), ("file.zarr", ("--overwrite",), "is a file"),
                                ("missing/s.zarr", (), "does not exist")):
        for command in ("stability", "dynamics"):
            outcome = invoke([command, runs["first"], "-o", tmp_path / out, *extra, "-q"])
            assert outcome.rc == 2 and message in outcome.err, outcome.err
    assert calls == [] and snapshot(tmp_path) == before

    def appear(*a, **k):  # noqa: ANN002, ANN003, ANN202 - another run writes the store meanwhile
        (tmp_path / "late.zarr").mkdir(exist_ok=True)
        (tmp_path / "late.zarr" / "theirs").write_text("theirs")
        return real(*a, **k)

    monkeypatch.setattr(workflow, "probe_stability", appear)
    outcome = invoke(["stability", runs["first"], "-o", tmp_path / "late.zarr", "--triplets", "1", *FAST])
    assert outcome.rc == 2 and "already exists" in outcome.err, outcome.err
    assert (tmp_path / "late.zarr" / "theirs").read_text() == "theirs" and not leftovers(tmp_path)
