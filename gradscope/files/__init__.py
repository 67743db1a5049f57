"""Reading and writing files on disk safely: checkpoints, run directories, locks and atomic publication.
``train/`` and ``store/`` both stand on it and import neither each other.

- :mod:`~gradscope.files.publish`: temporaries named after their writer, atomic publication
  (replace, or refuse to replace), stale-temporary removal, disk-full errors;
- :mod:`~gradscope.files.io`: atomic file writes, safe ``torch.load``, sha256 of a file;
- :mod:`~gradscope.files.lock`: the single-writer lock of a run directory or sweep point;
- :mod:`~gradscope.files.rundir`: the one reader of run directories (config, log, evaluation, resume state);
- :mod:`~gradscope.files.checkpoint`, :mod:`~gradscope.files.validate`: checkpoint format, reading
  and validation (gradscope and paper checkpoints) before any model is built.

Zarr stores are written by ``store/`` through :func:`~gradscope.files.publish.publish`.
"""
