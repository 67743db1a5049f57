"""The recurrent layers' own step with the attention caches held (``analysis.held``): the recurrent view of
a Qwen3-Next hybrid steps as the full core does on the recurrent entries, and its step Jacobian is the full
one restricted to them. The hybrid and its tokens come from tests/models/adapters/test_hf_qwen3_next.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from tests.models.adapters.test_hf_qwen3_next import POSITIONS, qwen, tokens  # noqa: E402,F401 - the fixture


def test_the_recurrent_view_is_the_step_jacobian_restricted_to_the_recurrent_blocks(qwen) -> None:  # noqa: ANN001
    """analysis.held.recurrent_view: its step Jacobian at every step equals the full core's J_t (torch.func, at
    the true state with the caches as they were) restricted to the recurrent rows and columns; its steps
    give the full core's recurrent states; its declared blocks are the recurrent ones."""
    from gradscope.analysis.held import held_names, recurrent_view
    from gradscope.models.core import generic_step_jacobian, initial_state, step_at

    _, wrapped, _ = qwen
    core = wrapped.core
    x = wrapped.core_inputs(tokens(11, n=2, length=POSITIONS))
    view, xv = recurrent_view(core, x)
    assert held_names(core) == "l1/keys, l1/values" and held_names(view) == ""
    keep = view.keep
    assert view.state_dim == sum(b.width for b in core.jacobian_structure().blocks if not b.held)
    with torch.no_grad():
        z, zr = initial_state(core, 2, x), initial_state(view, 2, xv)
        for t in range(x.shape[1]):
            full = generic_step_jacobian(core, x[:, t], z, t)[:, keep][:, :, keep]
            torch.testing.assert_close(generic_step_jacobian(view, xv[:, t], zr, t), full, rtol=1e-12, atol=1e-14)
            blocks = view.diagonal_blocks(xv[:, t], zr, t)
            assert len(blocks) == len(view.jacobian_structure().blocks)
            z, zr = step_at(core, x[:, t], z, t)[1], step_at(view, xv[:, t], zr, t)[1]
            torch.testing.assert_close(zr, z[:, keep], rtol=0, atol=0)
        xr2 = xv[[1, 0, 1]]  # a repeated, reordered batch keeps each row's own caches
        torch.testing.assert_close(step_at(view, xr2[:, 3], zr[[1, 0, 1]], 3)[1],
                                   step_at(view, xv[:, 3], zr, 3)[1][[1, 0, 1]], rtol=0, atol=0)
