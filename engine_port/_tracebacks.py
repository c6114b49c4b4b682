"""The traceback stored with a user error (``ErrorInfo.traceback``): the user's frames only,
bounded in size, never a database error's SQL text."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import traceback
from types import TracebackType
from typing import Any

from ._limits import safe_error_message

__all__ = ["MAX_TRACEBACK_CHARS", "format_user_traceback"]

MAX_TRACEBACK_CHARS = 8 * 1024
"""Bound of a stored traceback; the innermost frames (where the user's raise is) are kept."""

_HEADER = "Traceback (most recent call last):\n"


def _internal_dirs() -> tuple[str, ...]:
    """Frames of these directories above the user's function are the engine calling it."""
    files = (asyncio.__file__, concurrent.futures.__file__, __file__)
    return tuple(os.path.dirname(os.path.abspath(f or "")) + os.sep for f in files)


def _code_of(fn: Any) -> Any:
    try:
        fn = inspect.unwrap(fn)
    except ValueError:
        return None
    fn = getattr(fn, "func", fn)  # functools.partial
    code = getattr(fn, "__code__", None)
    if code is None:
        call = type(fn).__dict__.get("__call__")  # a callable object
        code = getattr(call, "__code__", None)
    return code


def _user_part(tb: TracebackType | None, fn: Any) -> TracebackType | None:
    """The traceback from the frame of ``fn`` on (else from the first frame outside the
    engine and asyncio): the frames above it are the engine calling the user's function."""
    code = _code_of(fn)
    internal = _internal_dirs()
    first_outside = None
    cur = tb
    while cur is not None:
        if code is not None and cur.tb_frame.f_code is code:
            return cur
        filename = os.path.abspath(cur.tb_frame.f_code.co_filename)
        if first_outside is None and not filename.startswith(internal):
            first_outside = cur
        cur = cur.tb_next
    return first_outside or tb


def format_user_traceback(
    exc: BaseException, fn: Any = None, limit: int = MAX_TRACEBACK_CHARS
) -> str | None:
    """``exc``'s traceback from the user's function ``fn`` down to the raise, with the
    exception line's message made safe (:func:`safe_error_message`), at most ``limit``
    characters (earlier frames are dropped first). None if ``exc`` has no traceback."""
    tb = _user_part(exc.__traceback__, fn)
    if tb is None:
        return None
    frames = traceback.StackSummary.extract(traceback.walk_tb(tb), capture_locals=False)
    lines = frames.format()
    message = safe_error_message(exc)
    last = f"{type(exc).__qualname__}: {message}\n" if message else f"{type(exc).__qualname__}\n"
    dropped = 0
    while lines and len(_HEADER) + sum(map(len, lines)) + len(last) + 60 > limit:
        lines.pop(0)
        dropped += 1
    omitted = [f"  ... {dropped} earlier frame(s) left out\n"] if dropped else []
    text = _HEADER + "".join(omitted + lines) + last
    return text if len(text) <= limit else text[-limit:]
