"""StateTape (issue #37 part 5): the states before every step without keeping T × D of them —
bit-identical to previous_states in any reading order, with O(√T) states held for a long run."""

from __future__ import annotations

import torch

from gradscope.analysis import dynamics as dyn
from gradscope.analysis.tape import StateTape

from cores import tiny_model


def test_the_tape_gives_previous_states_bit_for_bit_in_any_order_with_sqrt_t_states_held() -> None:
    for name in ("gru", "lstm", "s4d", "mamba"):
        model = tiny_model(name, 12, 4, 4)
        tokens = torch.randint(0, 12, (3, 50), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            x = model.core_inputs(tokens)
            kept = dyn.previous_states(model.core, x)
            tape = StateTape(model.core, x, keep_bytes=0)  # force segments: every ⌈√50⌉ = 8 steps
            assert tape.every == 8
            for order in (range(49, -1, -1), range(50), torch.randperm(50, generator=torch.Generator().manual_seed(0))):
                most = 0
                for t in order:
                    assert torch.equal(tape[int(t)], kept[:, int(t)]), (name, int(t))
                    most = max(most, tape.kept)
                assert most <= 7 + 8, (name, most)  # 7 checkpoints + one segment, never 50 states
            assert torch.equal(tape.stacked(), kept)
            small = StateTape(model.core, x)  # a short run keeps everything, as before
            assert small.every == 50 and torch.equal(small.stacked(), kept)


def test_gradient_flow_is_unchanged_when_its_states_come_from_segments(monkeypatch) -> None:
    import gradscope.analysis.tape as tape_module

    model = tiny_model("gru", 12, 4, 4)
    tokens = torch.randint(0, 12, (2, 30), generator=torch.Generator().manual_seed(2))
    fro, spectral = dyn.gradient_flow(model, tokens)
    monkeypatch.setattr(tape_module, "KEEP_BYTES", 0)
    monkeypatch.setattr(StateTape.__init__, "__kwdefaults__", {"every": None, "keep_bytes": 0})
    fro2, spectral2 = dyn.gradient_flow(model, tokens)
    assert torch.equal(fro, fro2) and torch.equal(spectral.nan_to_num(), spectral2.nan_to_num())
