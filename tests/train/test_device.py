"""Device names (``train.device.resolve_device``): a device this machine cannot use is refused in one line,
by the function and by the commands that take --device."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.fuzzkit import count
from tests.helpers.hardening import refused_untouched as refused
from tests.helpers.hardening import stopped_run
from gradscope.errors import GradscopeError
from gradscope.train.device import resolve_device


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 12 iterations stopped at 10 (checkpoints at 5 and 10, log lines at 5 and 10)."""
    return stopped_run(tmp_path_factory)


@pytest.mark.parametrize("name", ["meta", "xpu", "bogus", "cuda:99", "cpu:x", ""])
def test_resolve_device_refuses_unusable_devices(name: str, stopped: Path, tmp_path: Path) -> None:
    with pytest.raises(GradscopeError, match="device"):
        resolve_device(name)
    refused(["accuracy", stopped / "step-0000010.pt", "-o", tmp_path / "a.zarr", "-q", "--device", name], tmp_path)
    count("device-options")
