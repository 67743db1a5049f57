"""Rich progress bars shared by the commands."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress


def make_progress(console: Console | None = None, *fields: str) -> Progress:
    """A progress bar with M/N, percentage, elapsed and remaining time, plus named text fields."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    extra = [TextColumn(f"{name} {{task.fields[{name}]}}") for name in fields]
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                    *extra, TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    console=console, transient=False)
