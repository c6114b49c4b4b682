"""An engine over several drivers for a mixed (migration) period: new runs are routed per
workflow id by configuration, and every other call finds the run wherever it lives.

An idempotency key is the drivers' own (each finds its runs by key), so a start whose key
already started a run on another driver (the routes changed between the two starts, the
workflow was drained there, or the run was migrated) asks the other drivers first: see
:meth:`RoutingEngine.start`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from ._engine import WorkflowEngine
from ._graph import Workflow
from ._history import StepEntry
from ._limits import (
    check_import_call,
    check_list_call,
    check_page_call,
    check_start_input,
    check_wait_call,
)
from ._models import (
    Event,
    FlushResult,
    RunInfo,
    RunSnapshot,
    RunStatus,
    SignalResult,
    VersionInfo,
)
from ._registry import Registry
from ._rules import start_definition
from ._serde import input_fingerprint
from .errors import (
    EngineError,
    IdempotencyConflictError,
    InvalidInputError,
    PagingUnsupportedError,
    RunNotActiveError,
    RunNotFoundError,
    UnsupportedFeatureError,
    WaitTimeoutError,
    WorkflowDrainedError,
)

__all__ = ["ListRunsPage", "RoutingEngine"]

_MAX_CURSOR = 8000  # (a Temporal driver's own cursor is at most 4000 characters)
_UNMOVED = [s for s in RunStatus if s != RunStatus.MIGRATED]

Page = tuple[list[RunInfo], str | None]


class ListRunsPage(Protocol):
    """The signature of ``list_runs_page`` (the shipped drivers' and the routing engine's)."""

    async def __call__(
        self,
        *,
        workflow_id: str | None = None,
        status: RunStatus | Sequence[RunStatus] | None = None,
        limit: int = 100,
        after: str | None = None,
        version: str | None = None,
        created_after: datetime | None = None,
        id_prefix: str | None = None,
        idempotency_key: str | None = None,
        outputs: bool = True,
    ) -> Page: ...


class RoutingEngine(WorkflowEngine):
    """``engines`` maps driver names to engines; ``routes`` maps workflow ids to the driver
    that takes their new runs (others go to ``default``)."""

    driver_name = "routing"

    def __init__(
        self,
        registry: Registry,
        engines: Mapping[str, WorkflowEngine],
        *,
        default: str,
        routes: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(registry)
        if default not in engines:
            raise EngineError(f"default driver {default!r} is not among {sorted(engines)}")
        for wf, driver in (routes or {}).items():
            if driver not in engines:
                raise EngineError(f"route {wf!r} -> {driver!r}: no such driver configured")
        self.engines = dict(engines)
        self.default = default
        self.routes = dict(routes or {})

    def _order(self, first: str | None = None) -> list[WorkflowEngine]:
        names = [first or self.default] + [n for n in self.engines if n != (first or self.default)]
        return [self.engines[n] for n in names]

    async def connect(self) -> None:
        connected: list[WorkflowEngine] = []
        try:
            for engine in self.engines.values():
                await engine.connect()
                connected.append(engine)
        except BaseException:
            # (``async with`` calls no close() when connect() raises: the engines that did
            # connect would stay connected, with their pools and background tasks)
            for engine in reversed(connected):
                with contextlib.suppress(Exception):
                    await engine.close()
            raise

    async def close(self) -> None:
        """Close every engine, even when one of them fails to close (its error is raised
        once the others are closed)."""
        first: BaseException | None = None
        for engine in self.engines.values():
            try:
                await engine.close()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    async def _locate(self, run_id: str) -> tuple[WorkflowEngine, RunInfo]:
        """The engine that holds the live copy of the run (following migrated pointers)."""
        found: tuple[WorkflowEngine, RunInfo] | None = None
        for engine in self._order():
            try:
                info = await engine.get_run(run_id)
            except RunNotFoundError:
                continue
            if info.status != RunStatus.MIGRATED:
                return engine, info
            found = found or (engine, info)
            target = self.engines.get(info.migrated_to or "")
            if target is not None and target is not engine:
                with contextlib.suppress(RunNotFoundError):
                    return target, await target.get_run(run_id)
        if found is None:
            raise RunNotFoundError(run_id)
        return found

    async def start(
        self,
        workflow: str | Workflow[Any],
        input: Any,
        *,
        idempotency_key: str | None = None,
        version: str | None = None,
    ) -> RunInfo:
        """Start on the driver the workflow is routed to (or, when it is drained there, on
        the drain's target). With ``idempotency_key``, a run another driver already holds
        for that key is returned (or IdempotencyConflictError raised for a different input)
        instead of a second run: the routes may have changed since that run started.

        A key whose run was migrated is answered with the run's live copy (same run id) on
        the driver it moved to: a driver asked directly for the key on the engine the run
        left raises RunNotActiveError naming ``migrated_to``, which is followed here. Only
        when no configured driver holds the live copy does that error reach the caller."""
        wf_id = workflow.id if isinstance(workflow, Workflow) else workflow
        engine = self.engines[self.routes.get(wf_id, self.default)]
        if idempotency_key is not None:
            others = [e for e in self._order() if e is not engine]
            held = await self._keyed(workflow, input, idempotency_key, version, others)
            if held is not None:
                return held
        try:
            info = await engine.start(
                workflow, input, idempotency_key=idempotency_key, version=version
            )
        except RunNotActiveError as exc:
            # the key's run moved away from ``engine`` (after the look at the others above)
            return await self._moved(exc)
        except WorkflowDrainedError as exc:
            other = self.engines.get(exc.target)
            if other is None or other is engine:
                raise
            if idempotency_key is not None:
                # (a driver checks its drain before the key: a run of the key there is
                # returned, not started again on the target)
                held = await self._keyed(workflow, input, idempotency_key, version, [engine])
                if held is not None:
                    return held
            try:
                info = await other.start(
                    workflow, input, idempotency_key=idempotency_key, version=version
                )
            except RunNotActiveError as moved:
                return await self._moved(moved)
        return await self._live(info)

    async def _moved(self, exc: RunNotActiveError) -> RunInfo:
        """The live copy of the run a driver's keyed start named as moved away (``exc``), or
        ``exc`` itself when it is not a move or no configured driver holds that copy."""
        if exc.status != RunStatus.MIGRATED:
            raise exc
        try:
            info = await self.get_run(exc.run_id)
        except RunNotFoundError:
            raise exc from None
        if info.status == RunStatus.MIGRATED:
            raise exc
        return info

    async def _keyed(
        self,
        workflow: str | Workflow[Any],
        input: Any,
        key: str,
        version: str | None,
        engines: Sequence[WorkflowEngine],
    ) -> RunInfo | None:
        """The run one of ``engines`` holds for idempotency key ``key`` (its live copy),
        checked as a driver's own ``start`` checks a repeat: the same workflow and input
        fingerprint (the rule every driver shares), else IdempotencyConflictError. A driver
        without ``list_runs_page(idempotency_key=...)`` (both shipped drivers have it; the
        port's ``list_runs`` cannot filter by key) is not asked."""
        wf = start_definition(self.registry, workflow, key, version)  # (the start's checks)
        for engine in engines:
            page = getattr(engine, "list_runs_page", None)
            if page is None:
                continue
            found, _ = await page(idempotency_key=key, limit=1)
            if not found:
                continue
            held: RunInfo = found[0]
            value = check_start_input(wf, input)
            if input_fingerprint(wf.id, value) != input_fingerprint(held.workflow_id, held.input):
                raise IdempotencyConflictError(key, held.id)
            return await self._live(held)
        return None

    async def _live(self, info: RunInfo) -> RunInfo:
        """``info``, or the live copy of the run when ``info`` is the copy a migration left
        behind (the one a driver lists for the key); RunNotActiveError naming where the run
        went when no configured driver holds that copy (a start answers with a live run or
        raises, as a driver's own keyed start does)."""
        if info.status != RunStatus.MIGRATED:
            return info
        live = (await self._locate(info.id))[1]
        if live.status == RunStatus.MIGRATED:
            raise RunNotActiveError(live.id, live.status, "start", migrated_to=live.migrated_to)
        return live

    async def get_run(self, run_id: str) -> RunInfo:
        return (await self._locate(run_id))[1]

    async def list_runs(
        self,
        *,
        workflow_id: str | None = None,
        status: RunStatus | Sequence[RunStatus] | None = None,
        limit: int = 100,
        id_prefix: str | None = None,
        outputs: bool = True,
    ) -> list[RunInfo]:
        out: dict[str, RunInfo] = {}
        for engine in self.engines.values():
            for info in await engine.list_runs(
                workflow_id=workflow_id,
                status=status,
                limit=limit,
                id_prefix=id_prefix,
                outputs=outputs,
            ):
                if info.status != RunStatus.MIGRATED or info.id not in out:
                    out[info.id] = info
        # newest first across the drivers, as each driver lists its own (the first engine's
        # runs must not push a newer run of another driver past ``limit``)
        merged = sorted(out.values(), key=_newest_first)
        return merged[:limit]

    @property
    def list_runs_page(self) -> ListRunsPage:
        """See :meth:`_list_runs_page`; PagingUnsupportedError (also an AttributeError) when
        a configured driver has no ``list_runs_page``."""
        unpaged = [n for n, e in self.engines.items() if not hasattr(e, "list_runs_page")]
        if unpaged:
            raise PagingUnsupportedError(
                f"the routing engine cannot page runs: the driver(s) {unpaged} have no "
                "list_runs_page; list with list_runs() (newest first across the drivers), or "
                "give those drivers a list_runs_page"
            )
        return self._list_runs_page

    async def _list_runs_page(
        self,
        *,
        workflow_id: str | None = None,
        status: RunStatus | Sequence[RunStatus] | None = None,
        limit: int = 100,
        after: str | None = None,
        version: str | None = None,
        created_after: datetime | None = None,
        id_prefix: str | None = None,
        idempotency_key: str | None = None,
        outputs: bool = True,
    ) -> Page:
        """One page of runs and the cursor of the next page (None on the last one), the
        drivers' ``list_runs_page`` one after the other: every run of the default driver
        (newest first), then every run of each other driver in the order configured. So
        the order is newest first within each driver, not across them (``list_runs`` merges
        the newest runs of every driver). A page is filled from the next drivers when one
        runs out, so only the last page is short (it may be empty: the drivers after the
        one that ended a full page had no more runs). Each driver applies every filter.

        A run that was migrated between two of the drivers is listed once, as its live copy:
        the copy a migration leaves on the source (status ``migrated``) is listed only when
        ``status`` asks for ``migrated`` (then beside its live copy, if that matches too). A
        run whose live copy is on a driver this engine is not configured with is thus listed
        only under ``status="migrated"``.

        The cursor names the driver and carries that driver's own cursor, with a digest of
        both, of the filters and of the drivers configured: a corrupted cursor, one of
        another listing (other filters) or of an engine with other drivers raises
        InvalidInputError. (``created_after`` is left out of the digest: the web view takes
        it from the clock on every page, and each driver checks its own cursor.)"""
        statuses = check_list_call(workflow_id, status, limit, id_prefix)
        created_after = check_page_call(after, version, created_after, idempotency_key)
        names = [self.default] + [n for n in self.engines if n != self.default]
        listing = json.dumps(
            [
                names,
                workflow_id,
                sorted({s.value for s in statuses}),
                version,
                id_prefix,
                idempotency_key,
            ]
        )
        at, inner = (0, None) if after is None else _composite(after, listing, names)
        if limit == 0:
            return [], None
        wanted = statuses if statuses else _UNMOVED  # (not the copies migrations left)
        page: list[RunInfo] = []
        while at < len(names) and len(page) < limit:
            engine: Any = self.engines[names[at]]  # (list_runs_page is not in the port)
            found, inner = await engine.list_runs_page(
                workflow_id=workflow_id,
                status=wanted,
                limit=limit - len(page),
                after=inner,
                version=version,
                created_after=created_after,
                id_prefix=id_prefix,
                idempotency_key=idempotency_key,
                outputs=outputs,
            )
            page.extend(found)
            if inner is None:
                at += 1
        return page, None if at >= len(names) else _cursor(listing, names[at], inner)

    async def wait(self, run_id: str, timeout: float | None = None) -> RunInfo:
        timeout = check_wait_call(run_id, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while True:
            info = await self.get_run(run_id)
            if info.terminal and info.status != RunStatus.MIGRATED:
                return info
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(f"run {run_id!r} is still {info.status} after {timeout}s")
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.1)

    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, idempotency_key: str | None = None
    ) -> SignalResult:
        engine, _ = await self._locate(run_id)
        return await engine.signal(run_id, name, payload, idempotency_key=idempotency_key)

    async def cancel(self, run_id: str) -> RunInfo:
        engine, _ = await self._locate(run_id)
        return await engine.cancel(run_id)

    async def redrive(
        self, run_id: str, from_: str = "last_failure", *, version: str | None = None
    ) -> RunInfo:
        engine, _ = await self._locate(run_id)
        return await engine.redrive(run_id, from_, version=version)

    async def steps(self, run_id: str) -> list[StepEntry]:
        engine, _ = await self._locate(run_id)
        return await engine.steps(run_id)

    async def list_versions(self) -> list[VersionInfo]:
        merged: dict[tuple[str, str], VersionInfo] = {}
        for engine in self.engines.values():
            for v in await engine.list_versions():
                key = (v.workflow_id, v.version)
                old = merged.get(key)
                if old is None:
                    merged[key] = v
                    continue
                active = old.active_runs + v.active_runs
                merged[key] = old.model_copy(
                    update={
                        "active_runs": active,
                        "served_here": old.served_here or v.served_here,
                        "drained": active == 0,
                        "latest": old.latest or v.latest,
                        "new_runs_to": old.new_runs_to or v.new_runs_to,
                    }
                )
        return sorted(merged.values(), key=lambda v: (v.workflow_id, v.version))

    async def export_run(self, run_id: str, *, wait: float = 0.0) -> RunSnapshot:
        engine, _ = await self._locate(run_id)
        return await engine.export_run(run_id, wait=wait)

    async def complete_export(self, run_id: str, target: str) -> RunInfo:
        engine, _ = await self._locate(run_id)
        return await engine.complete_export(run_id, target)

    async def abort_export(self, run_id: str) -> None:
        engine, _ = await self._locate(run_id)
        await engine.abort_export(run_id)

    async def drain(self, workflow_ids: Sequence[str], target: str | None) -> None:
        """Drain ``workflow_ids`` on every driver but ``target`` (their new runs then go to
        ``target``: ``start`` follows WorkflowDrainedError there); ``target=None`` lifts the
        drain on every driver."""
        for name, engine in self.engines.items():
            if target is None or name != target:
                await engine.drain(workflow_ids, target)

    async def import_run(self, snapshot: RunSnapshot | Mapping[str, Any]) -> RunInfo:
        snapshot = check_import_call(snapshot)
        engine = self.engines[self.routes.get(snapshot.workflow_id, self.default)]
        return await engine.import_run(snapshot)

    @contextlib.asynccontextmanager
    async def worker(self, **options: Any) -> AsyncIterator[list[Any]]:
        if options:
            raise UnsupportedFeatureError("pass worker options to each driver's engine")
        async with contextlib.AsyncExitStack() as stack:
            yield [await stack.enter_async_context(e.worker()) for e in self.engines.values()]

    async def purge(self, older_than: timedelta | float) -> int:
        return sum([await e.purge(older_than) for e in self.engines.values()])

    async def flush_events(self) -> FlushResult:
        results = [await e.flush_events() for e in self.engines.values()]
        errors = [r.sink_error for r in results if r.sink_error]
        return FlushResult(
            published=sum(r.published for r in results),
            failed=sum(r.failed for r in results),
            dead_lettered=sum(r.dead_lettered for r in results),
            sink_status="degraded" if any(r.degraded for r in results) else "healthy",
            sink_error=errors[0] if errors else None,
        )

    async def replay_dlq(self) -> int:
        return sum([await e.replay_dlq() for e in self.engines.values()])

    async def dead_letters(self, limit: int = 1000) -> list[Event]:
        # oldest first across the drivers, as each driver returns its own
        events = [ev for e in self.engines.values() for ev in await e.dead_letters(limit)]
        return sorted(events, key=lambda ev: ev.at)[:limit]


def _newest_first(info: RunInfo) -> tuple[float, str]:
    created = info.created_at
    return (-created.timestamp() if created is not None else 0.0, info.id)


def _digest(listing: str, payload: bytes) -> str:
    return hashlib.sha256(listing.encode() + b"\x00" + payload).hexdigest()[:16]


def _cursor(listing: str, name: str, inner: str | None) -> str:
    payload = json.dumps([name, inner]).encode()
    encoded = base64.urlsafe_b64encode(payload).decode("ascii").rstrip("=")
    return f"{encoded}.{_digest(listing, payload)}"


def _composite(cursor: str, listing: str, names: Sequence[str]) -> tuple[int, str | None]:
    """The driver (its index in ``names``) and that driver's own cursor behind a cursor
    :func:`_cursor` gave for ``listing``; InvalidInputError for any other string."""
    encoded, _, digest = cursor.rpartition(".")
    try:
        if len(cursor) > _MAX_CURSOR or not encoded:
            raise ValueError
        payload = base64.urlsafe_b64decode(encoded.encode("ascii") + b"=" * (-len(encoded) % 4))
        if not hmac.compare_digest(digest, _digest(listing, payload)):
            raise ValueError
        name, inner = json.loads(payload)
        if name not in names or not (inner is None or isinstance(inner, str)):
            raise ValueError
    except (ValueError, TypeError, binascii.Error, UnicodeError):
        raise InvalidInputError(
            None,
            f"{cursor[:100]!r} is not a page cursor of this listing; use the one the previous "
            "page gave, with the same filters and drivers (or start again from the first page)",
        ) from None
    return list(names).index(name), inner
