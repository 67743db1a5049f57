"""Orchestration: load checkpoints → analyse → package results (the CLI calls these)."""
