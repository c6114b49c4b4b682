"""How the ``wfe`` command line reports an engine error: one line on stderr and an exit code
that says what went wrong (``EXIT_CODES``, documented in the README)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import traceback
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer

from engine_port.errors import (
    AmbiguousRunIdError,
    CommandInProgressError,
    ConfigurationError,
    DefinitionError,
    DriverUnavailableError,
    EngineError,
    IdempotencyConflictError,
    InvalidInputError,
    InvalidRedriveError,
    MigrationError,
    RunNotActiveError,
    RunNotFoundError,
    SerializationError,
    UnknownRedriveStageError,
    UnknownSignalError,
    UnsupportedFeatureError,
    VersionNotServedError,
    WorkflowDrainedError,
    WorkflowNotFoundError,
)

from ._entry import INTERRUPTED, command_started
from ._output import error_line

__all__ = ["EXIT_CODES", "exit_code", "fail", "guarded", "reported", "run_sync"]

T = TypeVar("T")
P = ParamSpec("P")

# exit codes: 0 ok, 1 any other engine error, 2 wrong usage (typer/click)
EXIT_CODES: dict[str, int] = {
    "not_found": 3,  # no such run / workflow
    "wrong_state": 4,  # the run or workflow is not in a state that allows it
    "unavailable": 5,  # the database, blob store or Temporal cluster cannot be reached
    "bad_config": 6,  # settings, wfe.toml, --app
    "bad_input": 7,  # an argument or payload the engine refuses
    "interrupted": INTERRUPTED,  # Ctrl-C (SIGINT), as a shell reports it (130)
}
_KINDS: tuple[tuple[tuple[type[EngineError], ...], str], ...] = (
    # first: an InvalidRedriveError (wrong state) that is bad input (a redrive from no stage)
    ((UnknownRedriveStageError,), "bad_input"),
    ((RunNotFoundError, WorkflowNotFoundError), "not_found"),
    (
        (
            RunNotActiveError,
            InvalidRedriveError,
            IdempotencyConflictError,
            WorkflowDrainedError,
            CommandInProgressError,
            VersionNotServedError,
            MigrationError,
        ),
        "wrong_state",
    ),
    ((DriverUnavailableError,), "unavailable"),
    ((ConfigurationError, DefinitionError, UnsupportedFeatureError), "bad_config"),
    (
        (InvalidInputError, SerializationError, AmbiguousRunIdError, UnknownSignalError),
        "bad_input",
    ),
)


def exit_code(exc: EngineError) -> int:
    """The process exit code for an engine error (see EXIT_CODES)."""
    for types, kind in _KINDS:
        if isinstance(exc, types):
            return EXIT_CODES[kind]
    return 1


def fail(exc: EngineError) -> NoReturn:
    """Print ``exc`` on stderr and exit with its code."""
    error_line(str(exc))
    raise typer.Exit(exit_code(exc))


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """Turn an EngineError raised inside the block into a one-line report and an exit code."""
    try:
        yield
    except EngineError as exc:
        fail(exc)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine to its end, reporting an EngineError it raises."""
    with reported():
        return asyncio.run(coro)


def guarded(command: Callable[P, T]) -> Callable[P, T]:
    """Wrap a command so that nothing reaches the user as a Python traceback: Ctrl-C exits
    130 with one line, and an error the command does not expect is one line naming it (the
    traceback is printed with WFE_TRACEBACK=1, for a bug report)."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            command_started()  # Ctrl-C is a KeyboardInterrupt again, handled below
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # typer.Exit, usage errors: click reports them
        except KeyboardInterrupt:
            error_line("interrupted")
            raise typer.Exit(EXIT_CODES["interrupted"]) from None
        except Exception as exc:
            if os.environ.get("WFE_TRACEBACK"):
                traceback.print_exc(file=sys.stderr)
            message = " ".join(str(exc).split()) or "(no message)"
            error_line(
                f"unexpected {type(exc).__name__}: {message}; this is a bug: please report "
                "it with the command you ran (WFE_TRACEBACK=1 prints the traceback)"
            )
            raise typer.Exit(1) from None

    return run
