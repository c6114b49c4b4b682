"""What a driver provides to run the contract, and what the scenarios use to observe it."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine_port import Event, MemorySink, Registry, SecretUrl, WorkflowEngine

__all__ = [
    "CONTRACT_MARKS",
    "Capabilities",
    "ExecutionLog",
    "Harness",
    "SettingsHarness",
    "eventually",
    "unique_id",
    "wait_for_events",
]


# every scenario is an async test: marked, so a driver's suite runs them whether its
# pytest-asyncio is in strict mode (the default) or auto mode
CONTRACT_MARKS = [pytest.mark.asyncio]


@dataclass(frozen=True)
class Capabilities:
    """What a driver supports. A scenario needing a capability the driver lacks is skipped
    (by capability, never by driver name)."""

    pinned_versions: bool = True
    crash_recovery: bool = True  # a worker process killed mid-stage is recovered
    stage_timeout: bool = True
    run_timeout: bool = True
    redrive: bool = True
    # redrive(run, version=...) re-pins a pending or suspended run (S13: a run stranded on a
    # version no worker serves any more moves to another, nothing re-run)
    repin_active: bool = True
    claim_check: bool = True
    migration: bool = False


class ExecutionLog:
    """Counts how often stage and step bodies ran, outside the engine (a file appended with
    O_APPEND, so worker processes can write to it too)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def hit(self, name: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (json.dumps(name) + "\n").encode())
        finally:
            os.close(fd)

    def entries(self) -> list[str]:
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def count(self, name: str) -> int:
        return self.entries().count(name)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.entries():
            out[e] = out.get(e, 0) + 1
        return out


class Harness(abc.ABC):
    """A driver's entry into the contract: how to build an engine for a registry."""

    name: str = "driver"
    capabilities: Capabilities = Capabilities()

    @abc.abstractmethod
    def engine(
        self, registry: Registry, sink: MemorySink, **settings: Any
    ) -> AbstractAsyncContextManager[WorkflowEngine]:
        """A connected engine for ``registry`` that publishes to ``sink``. Engines made by
        one harness in one test share their backing store (two registries, one database or
        cluster), as two deployments of one application would. ``settings`` may hold
        ``blob_store=`` (a BlobStore the engine must use instead of the configured one) and
        EngineSettings fields for this engine only (``spill_threshold_bytes``)."""

    def worker_env(self) -> dict[str, str]:
        """WFE_* settings for a worker subprocess (``wfe worker``) sharing the store."""
        raise NotImplementedError


def unique_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def eventually(
    check: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll ``check`` (sync or async) until it returns a truthy value; fail after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        await asyncio.sleep(interval)


async def wait_for_events(
    sink: MemorySink, run_id: str, until: str, timeout: float = 20.0
) -> list[Event]:
    """The run's deduplicated events once an event of type ``until`` was delivered."""

    def ready() -> list[Event] | None:
        events = sink.for_run(run_id)
        return events if any(e.type == until for e in events) else None

    result: list[Event] = await eventually(ready, timeout, what=f"event {until} of {run_id}")
    return result


# what a built-in driver does not do yet, so that `wfe conformance` and the test entry points
# skip those scenarios on it (a third-party driver declares its own through ``capabilities=``)
_BUILT_IN_GAPS: dict[str, Capabilities] = {}


class SettingsHarness(Harness):
    """A harness for any driver reachable through ``create_engine(settings)``; ``options``:
    the driver's own engine options past the settings (``heartbeat_timeout=``, ...)."""

    def __init__(
        self,
        settings: Any,
        *,
        name: str | None = None,
        capabilities: Capabilities | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.name = name or settings.driver
        self.capabilities = capabilities or _BUILT_IN_GAPS.get(settings.driver, Capabilities())
        self.options = dict(options or {})

    @contextlib.asynccontextmanager
    async def engine(
        self, registry: Registry, sink: MemorySink, **settings: Any
    ) -> AsyncIterator[WorkflowEngine]:
        from engine_port import create_engine

        blob_store = settings.pop("blob_store", None)
        configured = self.settings.model_copy(update=settings) if settings else self.settings
        engine = create_engine(
            configured, registry, event_sink=sink, blob_store=blob_store, **self.options
        )
        async with engine:
            yield engine

    def worker_env(self) -> dict[str, str]:
        env = {}
        for field_name in type(self.settings).model_fields:
            value = getattr(self.settings, field_name)
            if value is None or isinstance(value, dict):
                continue
            if isinstance(value, SecretUrl):
                value = value.reveal()  # the worker connects with it
            env[f"WFE_{field_name.upper()}"] = str(value)
        return env
