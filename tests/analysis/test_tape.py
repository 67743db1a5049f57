"""StateTape (issue #37 part 5): the states before every step without keeping T × D of them —
bit-identical to previous_states in any reading order, with O(√T) states held for a long run."""

from __future__ import annotations

import torch

from gradscope.analysis import dynamics as dyn
from gradscope.analysis.tape import StateTape

from tests.helpers.cores import tiny_model


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


def test_flow_grid_spectra_and_gates_are_unchanged_when_their_states_come_from_segments(monkeypatch) -> None:
    """Every exact part reads its states from a tape; forcing segments (every ⌈√T⌉ steps recomputed)
    gives the same numbers bit for bit."""
    def run() -> list[torch.Tensor]:
        out = []
        for name in ("gru", "s4d"):
            model = tiny_model(name, 12, 4, 4)
            tokens = torch.randint(0, 12, (2, 30), generator=torch.Generator().manual_seed(2))
            out += list(dyn.gradient_flow(model, tokens))
            out.append(dyn.tT_grid(model, tokens))
            out += list(dyn.step_spectra(model, tokens).values())
            with torch.no_grad():
                out.append(dyn.gate_norms(model.core, model.core_inputs(tokens))[1])
        return out

    kept = run()
    monkeypatch.setattr(StateTape.__init__, "__kwdefaults__", {"every": None, "keep_bytes": 0})
    assert StateTape(tiny_model("gru", 12, 4, 4).core, torch.zeros(1, 30, 4, dtype=torch.float64)).every == 6
    for a, b in zip(kept, run(), strict=True):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())
