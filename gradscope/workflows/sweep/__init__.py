"""Sweeps: ``grid`` reads a TOML spec into the grid of runs it names (each point train → accuracy → stability, run
resumably under a lock of its own) and ``cluster`` runs the points on dask.distributed, locally or on a scheduler
(``gradscope sweep``)."""
