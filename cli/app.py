"""The gradscope command line. Each command lives in its own module; this file only wires them."""

from __future__ import annotations

import typer

from .accuracy import accuracy_command
from .dynamics import dynamics_command
from .report import report_command
from .reproduce import reproduce_command
from .stability import stability_command
from .summarize import summarize_command
from .sweep import sweep_command
from .train import train_command

app = typer.Typer(
    name="gradscope",
    help="Analysis and diagnostics for trained sequence-model checkpoints (GRU, LSTM, Elman RNN, S4D): "
         "train on synthetic tasks, then measure gradient stability and frequency-conditioned accuracy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,  # plain help: typer's rich help imports markdown, pygments and pydantic (~0.3 s)
)
app.command("train")(train_command)
app.command("stability")(stability_command)
app.command("accuracy")(accuracy_command)
app.command("dynamics")(dynamics_command)
app.command("summarize")(summarize_command)
app.command("report")(report_command)
app.command("reproduce")(reproduce_command)
app.command("sweep")(sweep_command)


@app.callback()
def _root() -> None:
    """gradscope: why do sequence models train well or badly?"""


def main() -> None:
    app()
