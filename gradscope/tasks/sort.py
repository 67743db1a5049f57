"""``sort``: x_1…x_L ↦ the same tokens in ascending order (ties kept)."""

from __future__ import annotations

from typing import ClassVar

import torch

from gradscope.tasks.reverse import Reverse


class Sort(Reverse):
    """Reverse's input/query layout with sorted targets."""

    name: ClassVar[str] = "sort"
    settings: ClassVar[tuple[str, ...]] = ("distribution", "rarity")
    tiny = {"distribution": "dual"}

    def recall(self, x: torch.Tensor) -> torch.Tensor:
        return x.sort(dim=1).values
