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

    class Bars(Progress):
        def stop(self) -> None:
            """As rich's, but a display that never showed a bar (--quiet, or refused before its work began) leaves
            no empty line behind (rich prints one after the bars in a non-interactive console)."""
            if self.disable or any(t.visible for t in self.tasks):
                super().stop()
            else:
                self.live.stop()

    extra = [TextColumn(f"{name} {{task.fields[{name}]}}") for name in fields]
    return Bars(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                *extra, TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console, transient=False)
