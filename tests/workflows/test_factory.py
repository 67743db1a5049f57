"""A model factory (``--model-factory FILE.py:FUNCTION``): one that calls sys.exit, returns what is not
a model, or cannot be found is refused in one line naming the flag."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers import adapterkit
from tests.helpers.hardening import V, refused_one_line as refused
from gradscope.cli.app import app
from tests.models.test_wrap import FACTORY, lm_checkpoint  # noqa: F401 - the fixture


@pytest.mark.parametrize("code", [0, 3])
def test_a_factory_that_calls_sys_exit_is_one_line(tmp_path: Path, runner, code: int) -> None:  # noqa: ANN001
    """A factory calling sys.exit(0) ended `gradscope stability` with exit 0, no output and no store;
    sys.exit(3) with exit 3."""
    factory = tmp_path / "fac.py"
    factory.write_text(f"import sys\ndef build(path):\n    sys.exit({code})\n")
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"")
    probes = tmp_path / "p.npy"
    np.save(probes, adapterkit.probes(V, 3, 6, 2, seed=6).numpy())
    result = runner.invoke(app, ["stability", str(ckpt), "--model-factory", f"{factory}:build", "--probes", str(probes),
                                 "--target-pos", "2", "-o", str(tmp_path / "s.zarr"), "-q"])
    refused(result, "--model-factory", "SystemExit")
    assert not (tmp_path / "s.zarr").exists()


def test_factory_errors_are_one_line(lm_checkpoint: Path, runner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def build(path):\n    return 42\n")
    cases = [([f"{bad}:build"], "returned int"), ([f"{bad}:nope"], "defines no function 'nope'"),
             (["missing.py:build"], "is not a Python file"), (["nocolon"], "FILE.py:FUNCTION")]
    for (spec,), message in cases:
        result = runner.invoke(app, ["stability", str(lm_checkpoint), "--model-factory", spec, "-o",
                                     str(tmp_path / "x.zarr")])
        assert result.exit_code == 2 and message in result.stderr and "--model-factory" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    result = runner.invoke(app, ["stability", str(lm_checkpoint), "--model-factory", f"{FACTORY}:build",
                                 "-o", str(tmp_path / "y.zarr")])
    assert result.exit_code == 2 and "--probes" in result.stderr, result.stderr
