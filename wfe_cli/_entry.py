"""The ``wfe`` console script (and ``python -m wfe_cli``): :func:`main`.

Importing the command line takes a while (typer, pydantic, the port: about 0.4 s). A Ctrl-C in
that time raised KeyboardInterrupt inside some import and printed its traceback; so until a
command starts (:func:`command_started`, called by ``guarded``), Ctrl-C ends the process at
once with the exit code of an interrupted command and one line, as a Ctrl-C during a command
does. This module imports only standard modules (and ``wfe_cli`` only this module when
the script starts), so that the handler is in place within milliseconds of the interpreter's
own start; a Ctrl-C before that (while the interpreter itself starts) is Python's.
"""

import contextlib
import os
import signal

__all__ = ["INTERRUPTED", "command_started", "main"]

INTERRUPTED = 130  # the exit code of a command stopped by Ctrl-C (SIGINT), as a shell reports it


def _interrupted_before_the_command(signum: int, frame: object) -> None:
    """Ctrl-C before a command runs: nothing to clean up yet (no output, no connection), so
    exit at once: raising KeyboardInterrupt (or SystemExit) inside an import would print a
    traceback, or be swallowed by a library's ``except BaseException``."""
    with contextlib.suppress(OSError):  # (stderr closed: the exit code still says it)
        os.write(2, b"error: interrupted\n")
    os._exit(INTERRUPTED)


def command_started() -> None:
    """A command's own Ctrl-C handling takes over (``guarded`` reports KeyboardInterrupt,
    ``asyncio.run`` cancels its task, ``wfe worker`` stops gracefully): Python's default
    SIGINT handler again. A no-op where :func:`main` did not install its handler (a test
    running the app in-process) or off the main thread."""
    if signal.getsignal(signal.SIGINT) is _interrupted_before_the_command:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> None:
    """The ``wfe`` console script (and ``python -m wfe_cli``)."""
    # set first, looked at after (signal.getsignal is slow enough for a Ctrl-C to land in);
    # not where SIGINT is ignored (a command started in the background by a shell) or has a
    # handler of an embedding program, nor off the main thread (where none can be set)
    with contextlib.suppress(ValueError):
        previous = signal.signal(signal.SIGINT, _interrupted_before_the_command)
        if previous is not signal.default_int_handler:
            signal.signal(signal.SIGINT, previous)
    from ._main import app  # the slow part

    app()
