"""The one exception type for user errors (bad arguments, bad files)."""

from __future__ import annotations


class GradscopeError(ValueError):
    """A user error: the message names the argument, the value received and what is valid.

    The CLI catches exactly this type, prints the message on one line and exits with status 2.
    Anything else is a bug and is allowed to crash loudly.
    """


def check(condition: bool, message: str) -> None:
    """Raise :class:`GradscopeError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise GradscopeError(message)


class GradscopeWarning(UserWarning):
    """Something the user should know before trusting a number (e.g. a model with NaN weights). The CLI
    prints each as one line, ``warning: …``, on stderr, when it is raised (before any work)."""
