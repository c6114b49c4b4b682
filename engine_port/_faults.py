"""Storage faults on behalf of a stage: told apart from the stage's own errors.

DESIGN §5 "Infrastructure faults are not stage failures": when the engine's own storage (the
step ledger, the blob store behind it) fails while a stage attempt runs, the attempt is
abandoned as a crash would be; it never consumes one of the stage's retries.
"""

from __future__ import annotations

import asyncio

from ._ledger import StepLedger, StepRecord
from .errors import DriverUnavailableError, EngineError

__all__ = ["GuardedLedger", "InfrastructureFault", "describe_fault", "is_storage_fault"]


class InfrastructureFault(BaseException):
    """The engine's own storage failed during a durable step. A BaseException (like the
    runner's suspension) so that a stage body's ``except Exception`` cannot take it for its
    own error; the runner abandons the attempt even if the body swallows it anyway."""

    def __init__(self, what: str, cause: BaseException) -> None:
        super().__init__(f"{what} failed: {describe_fault(cause)}")
        self.what = what


_DBAPI_FAULTS = frozenset({"OperationalError", "InterfaceError"})


def is_storage_fault(exc: BaseException) -> bool:
    """Whether ``exc``, raised by the engine's storage, says the storage is unreachable or
    failing (retrying later may work) rather than something permanent: an unreachable backend
    (:class:`DriverUnavailableError`), an OS or network error, or a DB-API (PEP 249)
    ``OperationalError`` / ``InterfaceError``. Data and programming errors (a value a column
    rejects, a bug) are not: retrying them would loop, so they fail the attempt like any
    error, and so do the user-caused :class:`EngineError` types."""
    if isinstance(exc, DriverUnavailableError):
        return True
    if isinstance(exc, EngineError):
        return False
    if isinstance(exc, OSError):
        return True
    return any(cls.__name__ in _DBAPI_FAULTS for cls in type(exc).__mro__)


def describe_fault(exc: BaseException) -> str:
    """The exception's type and the first line of its message: a database error's message
    continues with its SQL text and parameters (user data), which never go anywhere."""
    text = str(exc).strip().splitlines()
    first = text[0][:300] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class GuardedLedger:
    """Wraps a driver's ledger for one attempt: a storage fault of any call raises
    :class:`InfrastructureFault` and is remembered in ``fault``."""

    def __init__(self, ledger: StepLedger) -> None:
        self._ledger = ledger
        self.fault: InfrastructureFault | None = None
        self.interrupted = False  # a ledger call was cancelled (by a stage timeout) midway

    def _fault(self, what: str, exc: BaseException) -> InfrastructureFault:
        fault = InfrastructureFault(what, exc)
        if self.fault is None:
            self.fault = fault
        return fault

    async def get(self, name: str) -> StepRecord | None:
        try:
            return await self._ledger.get(name)
        except Exception as exc:
            if not is_storage_fault(exc):
                raise
            raise self._fault(f"reading step {name!r} from the ledger", exc) from exc
        except asyncio.CancelledError:
            self.interrupted = True
            raise

    async def put(self, record: StepRecord) -> None:
        try:
            await self._ledger.put(record)
        except Exception as exc:
            if not is_storage_fault(exc):
                raise
            raise self._fault(f"journaling step {record.name!r}", exc) from exc
        except asyncio.CancelledError:
            self.interrupted = True
            raise

    async def consume_signal(self, record: StepRecord) -> StepRecord | None:
        try:
            return await self._ledger.consume_signal(record)
        except Exception as exc:
            if not is_storage_fault(exc):
                raise
            raise self._fault(f"taking signal {record.signal!r}", exc) from exc
        except asyncio.CancelledError:
            self.interrupted = True
            raise
