"""One runner per grid point: the single-writer lock, which lives in :mod:`gradscope.files.lock`
(training takes it for every run directory too) and is re-exported here for the sweep."""

from __future__ import annotations

from gradscope.files.lock import BEAT, STALE_AFTER, is_stale, point_lock

__all__ = ["BEAT", "STALE_AFTER", "is_stale", "point_lock"]
