"""The continuous task (paper App. B.3): its tokens lie on the sphere and reverse, and a probe's ids read
the seeded table of sphere points and the query."""

from __future__ import annotations

import torch

from tests.helpers.runs import OTHER_CORE
from gradscope.config import ModelConfig, TaskConfig
from gradscope.models import SeqModel
from gradscope.tasks import make_task


def test_continuous_tokens_lie_on_the_sphere_and_reverse() -> None:
    task = make_task(TaskConfig(name="reverse-continuous", dim=5, length=4))
    batch = task.sample(10, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (10, 8, 6) and batch.targets.shape == (10, 8, 5)
    x = batch.inputs[:, :4, :5]
    torch.testing.assert_close(x.norm(dim=-1), torch.ones(10, 4))
    assert torch.equal(batch.targets[:, 4:], x.flip(1)) and batch.targets[:, :4].isnan().all()
    assert torch.equal(batch.inputs[:, 4:, 5], torch.ones(10, 4)) and not batch.inputs[:, 4:, :5].any()
    again = task.sample(10, torch.Generator().manual_seed(0))
    assert torch.equal(again.inputs, batch.inputs)


def test_vector_probe_ids_read_the_table_and_the_query() -> None:
    from gradscope.tasks.reverse_continuous import probe_table, vector_probe_model

    torch.manual_seed(0)
    model = SeqModel(ModelConfig(core=OTHER_CORE, vocab_size=4, embed_size=6, hidden_size=8, pe="sinusoidal", max_len=8,
                                 inputs="vectors"))
    probe = vector_probe_model(model, seed=7)
    table = probe_table(4, 7)
    assert torch.equal(probe.table, table) and probe.query_token == table.shape[0]
    torch.testing.assert_close(table.norm(dim=-1), torch.ones(table.shape[0]))
    ids = torch.tensor([[5, 0, 17, probe.query_token, probe.query_token]])
    by_hand = torch.zeros(1, 5, 5)
    by_hand[0, :3, :4] = table[[5, 0, 17]]
    by_hand[0, 3:, 4] = 1.0  # the query flag; its coordinates are zero
    assert torch.equal(probe.core_inputs(ids), model.core_inputs(by_hand))
    assert torch.equal(probe(ids), model(by_hand))
