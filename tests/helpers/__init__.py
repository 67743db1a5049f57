"""Shared test helpers: contracts every registered unit must meet (contracts.py)."""
