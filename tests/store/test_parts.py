"""A store whose checkpoints come from different configurations (a vanilla and a PE checkpoint in one
`gradscope accuracy` call; two seeds in one `stability` call) is split into one part per configuration
and reported so: every number under the label of the checkpoint it came from (its summary, one trial per
part: tests/store/test_summary.py).

The reference is independent of the splitting: the same checkpoints evaluated into one store each.
Before store/parts.py, the mixed accuracy store summarised as one trial labelled pe=none holding the
PE checkpoint's numbers (token accuracy 0.770 where vanilla's is 0.641).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gradscope.errors import GradscopeError
from gradscope.store.inputs import load_inputs
from gradscope.store.io import read_store, write_store
from gradscope.store.parts import config_parts
from gradscope.workflows.accuracy import AccuracyOptions, run_checkpoint_accuracy
from gradscope.workflows.stability import StabilityOptions, run_checkpoint_stability

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"
VANILLA = SAMPLES / "gru-none-s1" / "step-0006000.pt"
PE = SAMPLES / "gru-sinusoidal-s1" / "step-0006000.pt"
SEED1 = SAMPLES / "gru60k-none-s2" / "step-0060000.pt"
SEED2 = SAMPLES / "gru60k-none-s5" / "step-0060000.pt"
ACC = AccuracyOptions(device="cpu")
STAB = StabilityOptions(triplets=4, seed=3, sv=8, device="cpu")


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mixed")
    out = {}
    for name, files in (("mixed", [VANILLA, PE]), ("vanilla", [VANILLA]), ("pe", [PE])):
        out[f"acc-{name}"] = root / f"acc-{name}.zarr"
        write_store(run_checkpoint_accuracy(files, ACC).to_xarray(), out[f"acc-{name}"])
    for name, files in (("seeds", [SEED1, SEED2]), ("s1", [SEED1]), ("s2", [SEED2])):
        out[f"stab-{name}"] = root / f"stab-{name}.zarr"
        write_store(run_checkpoint_stability(files, STAB).to_xarray(), out[f"stab-{name}"])
    return out


def test_report_labels_each_part_by_its_own_config(stores: dict[str, Path]) -> None:
    items = load_inputs([stores["acc-mixed"]])
    assert [i.model["pe"] for i in items] == ["none", "sinusoidal"]
    assert len({i.label for i in items}) == 2
    for item, alone in zip(items, ("acc-vanilla", "acc-pe")):
        reference = read_store(stores[alone])
        assert item.ds.sizes["checkpoint"] == 1
        # bit for bit: the same process and code path; the split only selects
        np.testing.assert_array_equal(item.ds["grid_bin_accuracy"].values, reference["grid_bin_accuracy"].values)
        assert [c["path"] for c in item.meta["checkpoints"]] == [str(VANILLA if alone == "acc-vanilla" else PE)]


def test_one_configuration_is_one_unchanged_part(stores: dict[str, Path]) -> None:
    ds = read_store(stores["stab-s1"])
    assert config_parts(ds) == [ds] and config_parts(ds)[0] is ds
    legacy = ds.copy()  # a store written before per-checkpoint configs were recorded
    legacy.attrs = {**ds.attrs, "checkpoints": json.dumps([{k: v for k, v in e.items() if not k.endswith("_config")}
                                                           for e in json.loads(ds.attrs["checkpoints"])])}
    assert config_parts(legacy)[0] is legacy


def test_a_malformed_checkpoint_config_is_one_line(stores: dict[str, Path], tmp_path: Path) -> None:
    ds = read_store(stores["acc-mixed"])
    entries = json.loads(ds.attrs["checkpoints"])
    entries[1]["model_config"] = ["not", "an", "object"]
    ds.attrs["checkpoints"] = json.dumps(entries)
    write_store(ds, tmp_path / "bad.zarr")
    with pytest.raises(GradscopeError, match="model_config that is not an object"):
        read_store(tmp_path / "bad.zarr")
