"""The run configs (``gradscope.config``, with the model's and the task's): values out of range are refused
as user errors when a config is built, and the extremes of each range are accepted."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from gradscope.errors import GradscopeError


@pytest.mark.parametrize("build", [
    lambda: TrainConfig(seed=-1), lambda: TrainConfig(seed=2**63), lambda: TrainConfig(seed=1.5),
    lambda: TrainConfig(batch_size=True), lambda: TrainConfig(lr=float("nan")), lambda: TrainConfig(eps=float("inf")),
    lambda: TrainConfig(betas=(0.9,)), lambda: TrainConfig(betas="ab"), lambda: TrainConfig(device="meta"),
    lambda: TrainConfig(device=3), lambda: TrainConfig(iterations="5"), lambda: TrainConfig(clip=float("nan")),
    lambda: ModelConfig(hidden_size="16"), lambda: ModelConfig(num_layers=10**6), lambda: ModelConfig(core=["gru"]),
    lambda: ModelConfig(pe=None), lambda: TaskConfig(vocab_size="8"), lambda: TaskConfig(rarity="x"),
    lambda: TaskConfig(length=10**9), lambda: TaskConfig(name=["reverse"]), lambda: TaskConfig(hold_max=10**12, name="copy"),
    lambda: RunConfig(model="gru"),
])
def test_configs_refuse_values_out_of_range(build: Callable[[], Any]) -> None:
    with pytest.raises(GradscopeError):
        build()


def test_configs_accept_the_extremes_of_their_ranges() -> None:
    assert TrainConfig(seed=0).seed == 0 and TrainConfig(seed=2**63 - 1).seed == 2**63 - 1
    assert TrainConfig(device="cuda:1").device == "cuda:1"
