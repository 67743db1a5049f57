"""The gradscope command line. Each command lives in its own module; this file only wires them."""

from __future__ import annotations

from typing import IO, Any

import typer
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

from .accuracy import AccuracyCommand, accuracy_command
from .corpus import corpus_app
from .dynamics import DynamicsCommand, dynamics_command
from .errors import err_console
from .report import ReportCommand, report_command
from .reproduce import ReproduceCommand, reproduce_command
from .stability import StabilityCommand, stability_command
from .summarize import SummarizeCommand, summarize_command
from .sweep import SweepCommand, sweep_command
from .train import TrainCommand, train_command



class _OneLineUsageError(ClickException):
    """A usage error (unknown option, a value of the wrong type, a missing argument) as one line,
    exit status 2, like every other user error."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        err_console.print(f"error: {' '.join(self.format_message().split())}", markup=False)


class OneLineGroup(typer.core.TyperGroup):
    """The command group, with click's multi-line usage errors turned into one line."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except NoArgsIsHelpError:
            raise
        except UsageError as exc:
            raise _OneLineUsageError(exc.format_message()) from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except NoArgsIsHelpError:
            raise
        except UsageError as exc:
            name = f"{ctx.command_path} {ctx.invoked_subcommand}" if ctx.invoked_subcommand else ctx.command_path
            raise _OneLineUsageError(f"{exc.format_message()} (see '{name} --help')") from None


app = typer.Typer(
    cls=OneLineGroup,
    name="gradscope",
    help="Analysis and diagnostics for trained recurrent and state-space models (gradscope's registered "
         "cores, or your own through gradscope.wrap): train on synthetic tasks, then measure gradient "
         "stability, frequency-conditioned accuracy and dynamics.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,  # plain help: typer's rich help imports markdown, pygments and pydantic (~0.3 s)
)
app.command("train", cls=TrainCommand)(train_command)
app.command("stability", cls=StabilityCommand)(stability_command)
app.command("accuracy", cls=AccuracyCommand)(accuracy_command)
app.command("dynamics", cls=DynamicsCommand)(dynamics_command)
app.command("summarize", cls=SummarizeCommand)(summarize_command)
app.command("report", cls=ReportCommand)(report_command)
app.command("reproduce", cls=ReproduceCommand)(reproduce_command)
app.command("sweep", cls=SweepCommand)(sweep_command)
app.add_typer(corpus_app)


@app.callback()
def _root() -> None:
    """gradscope: why do sequence models train well or badly?"""


ANALYSES = ("stability", "dynamics", "accuracy", "reproduce")  # commands whose small products share the cores


def main() -> None:
    """The console script. An analysis started from it uses the cores no other process wants
    (:func:`gradscope.guard.use_free_cores`; a second thread on a busy core slows small products many times
    over): here, once, in a fresh interpreter, never from a process that embeds the app (a notebook, a test
    runner, a forked child), whose thread pool is not its own to resize."""
    import sys

    argv = sys.argv[1:]
    if argv and argv[0] in ANALYSES and not {"--help", "-h"} & set(argv):
        from gradscope.guard import use_free_cores

        use_free_cores()
    app()
