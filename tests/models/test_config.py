"""The model's configuration: an unknown core and settings of another core are refused, and a format-1
config (every core's fields) and a format-2 one (the core's own settings) are one configuration in labels."""

from __future__ import annotations

import pytest

from tests.helpers.runs import DEFAULT_CORE
from gradscope.config import ModelConfig
from gradscope.models import CORES


def test_unknown_core_and_foreign_settings_are_refused() -> None:
    from gradscope.errors import GradscopeError
    with pytest.raises(GradscopeError, match=f"core: got 'linear'; valid values are {', '.join(CORES)}$"):
        ModelConfig(core="linear")
    with pytest.raises(GradscopeError, match="unknown field"):
        ModelConfig(core=DEFAULT_CORE, core_config={"state_size": 8})


def test_format_1_and_format_2_model_configs_compare_equal_in_labels() -> None:
    """A format-1 run (S4D fields on every core, the shipped samples) and a format-2 store of the same
    model are one configuration in summaries and reports (no 'dt_max=None' in labels)."""
    import dataclasses

    from gradscope.models import model_fields
    legacy = {"core": "gru", "vocab_size": 64, "embed_size": 64, "hidden_size": 128, "num_layers": 1, "pe": "none",
              "pe_combine": "concat", "max_len": 32, "state_size": 64, "dt_min": 0.001, "dt_max": 0.1}
    new = dataclasses.asdict(ModelConfig.from_dict(legacy))
    assert new["core_config"] == {} and model_fields(legacy) == model_fields(new)
    assert "state_size" not in model_fields(legacy)
    s4d = {**legacy, "core": "s4d", "state_size": 16}
    assert model_fields(s4d)["state_size"] == 16 == ModelConfig.from_dict(s4d).core_config.state_size
