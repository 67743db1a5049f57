"""`gradscope report` (being written; replaced before this lands)."""

from __future__ import annotations

from gradscope.errors import GradscopeError

from .errors import user_errors


@user_errors
def report_command() -> None:
    """Render stores and runs into one offline HTML report."""
    raise GradscopeError("report: not available yet")
