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


def _study(core: str, vocab: int, **train: object) -> RunConfig:
    """The CPU-scale study configuration (issue #6): dual-frequency reverse, L = 16, about 5–10
    minutes per model on 2 CPU cores. Starting point: the GRU region measured in FACTS.md."""
    return RunConfig(
        model=ModelConfig(core=core, embed_size=64, hidden_size=128, state_size=64),
        task=TaskConfig(name="reverse", vocab_size=vocab, length=16, distribution="dual", rarity=0.125,
                        heldout_size=1024, grid_per_cell=16),
        train=TrainConfig(**{"iterations": 6000, "batch_size": 128, "lr": 3e-3, "warmup": 200,
                             "checkpoint_every": 1500, "log_every": 100, **train}),
    )


def _paper(core: str, vocab: int) -> RunConfig:
    """SPEC §3 at paper scale: E = H = 512, L = 64, batch 512, 300k iterations (for a GPU)."""
    return RunConfig(
        model=ModelConfig(core=core, embed_size=512, hidden_size=512, state_size=64),
        task=TaskConfig(name="reverse", vocab_size=vocab, length=64, distribution="dual", rarity=0.125,
                        heldout_size=1024, grid_per_cell=16),
        train=TrainConfig(iterations=300_000, batch_size=512, lr=1e-3, warmup=1000, checkpoint_every=5000),
    )


# scale → core → base configuration (vanilla; `gradscope reproduce` adds the PE variant).
SCALES: dict[str, dict[str, RunConfig]] = {
    "tiny": {"gru": _study("gru", 64), "lstm": _study("lstm", 64), "s4d": _study("s4d", 64)},
    # dual-frequency vocabularies of the paper's Figure 3: GRU K=64, LSTM K=1024, S4D K=2048
    "paper": {"gru": _paper("gru", 64), "lstm": _paper("lstm", 1024), "s4d": _paper("s4d", 2048)},
}
