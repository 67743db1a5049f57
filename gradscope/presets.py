"""Named starting configurations. Explicit options override preset values field by field."""

from __future__ import annotations

from gradscope.config import ModelConfig, RunConfig, TaskConfig, TrainConfig

PRESETS: dict[str, RunConfig] = {
    # About a minute on 2 CPU cores: dual-frequency reverse, small GRU.
    "tiny": RunConfig(
        model=ModelConfig(core="gru", embed_size=32, hidden_size=64),
        task=TaskConfig(name="reverse", vocab_size=16, length=8, distribution="dual", heldout_size=256,
                        grid_per_cell=8),
        train=TrainConfig(iterations=3000, batch_size=64, lr=1e-2, warmup=100, checkpoint_every=500,
                          log_every=50),
    ),
    # SPEC §3 hyperparameters (meant for a GPU): E = H = 512, L = 64, batch 512, 300k iterations.
    "paper": RunConfig(
        model=ModelConfig(core="gru", embed_size=512, hidden_size=512),
        task=TaskConfig(name="reverse", vocab_size=64, length=64, distribution="uniform", heldout_size=1024,
                        grid_per_cell=16),
        train=TrainConfig(iterations=300_000, batch_size=512, lr=1e-3, warmup=1000, checkpoint_every=5000,
                          log_every=100),
    ),
}
