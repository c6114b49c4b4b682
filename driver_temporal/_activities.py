"""The activities: one dynamic activity runs stage attempts (type = stage id) and
compensations (type = ``<stage>.compensate``) through ``engine_port.StageRunner``; small named
activities publish events, dead-letter them and save a run's final state.

Crash survival of steps: every step record the StageRunner journals during an attempt is sent
at once as the activity's heartbeat details (large results spilled to the BlobStore first).
When the worker dies, Temporal times the activity out (heartbeat timeout) and retries it on
another worker with the same stage attempt; that retry seeds its ledger from the last
heartbeat details, so steps completed before the crash replay from the journal instead of
running again. The window is the SDK's heartbeat throttle: a step completed less than one
throttle interval (0.8 x heartbeat timeout, first heartbeat immediate) before the crash may
run again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from engine_port import (
    ClaimCheck,
    Completed,
    Event,
    EventSink,
    Failed,
    InMemoryLedger,
    Registry,
    StageRequest,
    StageRunner,
    StepRecord,
    is_spill_ref,
)
from engine_port.errors import EngineError

from ._wire import dlq_key, record_from_json, record_to_json, spill_key, state_key

__all__ = ["COMPENSATE_SUFFIX", "DriverActivities", "EventStats"]

COMPENSATE_SUFFIX = ".compensate"


@dataclass
class EventStats:
    """Delivery counters since the last ``flush_events()``."""

    delivered: int = 0
    failed: int = 0
    dead: int = 0

    def take(self) -> tuple[int, int, int]:
        out = (self.delivered, self.failed, self.dead)
        self.delivered = self.failed = self.dead = 0
        return out


class _JournalLedger(InMemoryLedger):
    """An in-memory ledger that heartbeats every new record (spilled) as it is written."""

    def __init__(
        self,
        records: dict[str, StepRecord],
        signals: dict[str, Any],
        journal: dict[str, dict[str, Any]],
        spill: Any,
    ) -> None:
        super().__init__(records, signals)
        self.journal = journal
        self._spill = spill

    async def put(self, record: StepRecord) -> None:
        await super().put(record)
        self.journal[record.name] = await self._spill(record)
        activity.heartbeat(list(self.journal.values()))


class DriverActivities:
    """Activity implementations bound to one engine (registry, blob store, event sink)."""

    def __init__(
        self,
        registry: Registry,
        claim: ClaimCheck,
        runner: StageRunner,
        sink: EventSink | None,
        stats: EventStats,
        heartbeat_every: float,
    ) -> None:
        self.registry = registry
        self.claim = claim
        self.runner = runner
        self.sink = sink
        self.stats = stats
        self.heartbeat_every = heartbeat_every

    # -- stage attempts and compensations -----------------------------------------------------
    @activity.defn(dynamic=True)
    async def stage(self, args: Sequence[RawValue]) -> dict[str, Any]:
        info = activity.info()
        task: dict[str, Any] = activity.payload_converter().from_payload(args[0].payload, dict)
        try:
            wf = self.registry.get(task["workflow_id"], task["version"])
        except EngineError as exc:
            raise ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True) from None
        compensation = info.activity_type.endswith(COMPENSATE_SUFFIX)
        req = StageRequest(
            run_id=task["run_id"],
            workflow=wf,
            stage_id=task["stage_id"],
            attempt=task["attempt"],
            input=await self.claim.load(task["input"]),
            outputs={k: await self.claim.load(v) for k, v in task["outputs"].items()},
        )
        journal: dict[str, dict[str, Any]] = {}
        records = {r["name"]: r for r in task["steps"]}
        if info.heartbeat_details:
            # a previous try of this attempt died after journaling these steps
            for r in info.heartbeat_details[0] or ():
                records[r["name"]] = r
                journal[r["name"]] = r
        loaded = {name: await self._load_record(r) for name, r in records.items()}
        signals = {k: await self.claim.load(v) for k, v in task.get("signals", {}).items()}

        async def spill(rec: StepRecord) -> dict[str, Any]:
            data = record_to_json(rec)
            key = spill_key(req.run_id, "steps", req.stage_id, task["redrive"], rec.name)
            data["result"] = await self.claim.dump(rec.result, key)
            return data

        ledger = _JournalLedger(loaded, signals, journal, spill)
        beat = asyncio.create_task(self._heartbeat(journal))
        try:
            if compensation:
                outcome = await self.runner.compensate(
                    req, await self.claim.load(task["output"]), ledger
                )
            else:
                outcome = await self.runner.run(req, ledger)
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        result: dict[str, Any] = {
            "steps": list(journal.values()),
            "consumed": list(ledger.consumed),
        }
        if isinstance(outcome, Completed):
            output = None
            if not compensation:
                key = spill_key(
                    req.run_id, "outputs", req.stage_id, f"r{task['redrive']}-a{req.attempt}"
                )
                output = await self.claim.dump(outcome.output, key, force=True)
            result.update(
                kind="completed",
                output=output,
                events=[{"type": e.type, "data": e.data} for e in outcome.events],
            )
        elif isinstance(outcome, Failed):
            result.update(
                kind="failed", error=outcome.error.model_dump(), retryable=outcome.retryable
            )
        else:
            result.update(
                kind="suspended",
                reason=outcome.reason,
                until=None if outcome.until is None else outcome.until.isoformat(),
                waiting_for=outcome.waiting_for,
            )
        return result

    async def _load_record(self, data: dict[str, Any]) -> StepRecord:
        rec = record_from_json(data)
        if is_spill_ref(rec.result):
            rec = rec.done(await self.claim.load(rec.result)) if rec.completed else rec
        return rec

    async def _heartbeat(self, journal: dict[str, dict[str, Any]]) -> None:
        while True:
            activity.heartbeat(list(journal.values()))
            await asyncio.sleep(self.heartbeat_every)

    # -- events -------------------------------------------------------------------------------
    @activity.defn(name="wfe.publish")
    async def publish(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        """Deliver a batch of one run's events to the sink; a failure is reported, not raised
        (the workflow counts failures and dead-letters the batch)."""
        if self.sink is None or not events:
            return {"ok": True}
        try:
            await self.sink.publish([Event.model_validate(e) for e in events])
        except Exception as exc:
            self.stats.failed += 1
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self.stats.delivered += len(events)
        return {"ok": True}

    @activity.defn(name="wfe.dead_letter")
    async def dead_letter(self, events: list[dict[str, Any]]) -> None:
        """Keep undeliverable events in the shared BlobStore under ``dlq/`` (replay_dlq)."""
        import pydantic_core

        for e in events:
            await self.claim.store.put(
                dlq_key(e["run_id"], e["seq"], e["id"]), pydantic_core.to_json(e)
            )
        self.stats.dead += len(events)

    @activity.defn(name="wfe.save_state")
    async def save_state(self, run_id: str, state: dict[str, Any]) -> None:
        """Store a finished run's full state (ledgers, outputs, staged events) for redrive."""
        import pydantic_core

        await self.claim.store.put(state_key(run_id), pydantic_core.to_json(state))
