"""Shared test helpers, imported as ``tests.helpers.<module>``: contracts every registered unit must meet
(contracts.py), small real runs (runs.py), the fuzz and fault kits (fuzzkit.py, faultkit.py, storekit.py),
what the hardening tests of several packages share (hardening.py: runs and checkpoints to mutate;
storefuzz.py: stores and run files to mutate, and how a command that read them is judged), tiny cores
(cores.py), float tolerances (floats.py), the library adapters' brute forces (adapterkit.py) and the report's
layout measure (layout_check.py)."""
