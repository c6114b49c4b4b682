"""The signal queue of the interpreter workflow (a base of ``_workflow.GraphWorkflow``).

Signals of one name queue per run in arrival order, as Temporal signals do: the workflow keeps
every buffered signal (``{name, payload, idempotency_key}``, oldest first) and hands a stage
attempt the queue per name; the attempt's ``wait_for_signal`` steps take from the front and the
activity reports each one taken (``consumed``: a name per signal), which the workflow then
drops from its queue. A signal's idempotency key, once seen, is kept for the life of the run, so
a repeat is not queued again (``already_completed``). The engine sends signals as the
``wfe.signal`` update (so it can report the outcome) or, when no worker answers, as a plain
Temporal signal wrapped with its delivery id; a raw Temporal signal from an operator
(``temporal workflow signal --name go --input '{...}'``) queues its input as the payload.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from ._freezing import migration_error

__all__ = ["SIGNAL_UPDATE", "SignalHandlers"]

SIGNAL_UPDATE = "wfe.signal"


def _is_wrapped(value: Any) -> bool:
    """A signal body the engine itself sent (``TemporalEngine.signal``), not a raw payload."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("delivery"), str)
        and set(value) <= {"name", "payload", "delivery", "idempotency_key"}
    )


class SignalHandlers:
    """Signal handlers and the queue; the attributes below are ``GraphWorkflow``'s (its
    ``__init__`` sets ``_signals``, ``_signal_keys`` and ``_deliveries``)."""

    _run_id: str
    _final: bool
    _frozen: bool
    _migrated_to: str | None
    _signals: list[dict[str, Any]]
    _signal_keys: set[str]
    _deliveries: dict[str, dict[str, Any]]
    # the stage whose attempt in flight was given the buffered signals (``_lease_signals``)
    _signal_holder: str | None = None

    @workflow.signal(dynamic=True)
    def on_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """A signal buffered on the server: one the engine sent when no worker answered its
        update (wrapped, with its delivery id), or a raw Temporal signal from an operator
        (``temporal workflow signal --name go --input '{...}'``), whose input is the payload.
        Either way it just queues."""
        value: Any = None
        if args:
            value = workflow.payload_converter().from_payload(args[0].payload)
        if _is_wrapped(value):
            self._deliver(
                name, value.get("payload"), value.get("delivery"), value.get("idempotency_key")
            )
        else:
            self._deliver(name, value, None, None)

    @workflow.update(name=SIGNAL_UPDATE)
    def on_signal_update(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._deliver(
            body["name"], body.get("payload"), body.get("delivery"), body.get("idempotency_key")
        )

    @on_signal_update.validator
    def _validate_signal(self, body: dict[str, Any]) -> None:
        if self._final or self._migrated_to is not None:
            raise ApplicationError("run is no longer active", type="RunNotActiveError")
        if self._frozen:
            raise migration_error(
                f"run {self._run_id!r} is frozen for migration; signal it once the move "
                "completed (on its target) or was aborted"
            )

    def _deliver(
        self, name: str, payload: Any, delivery: str | None, key: str | None
    ) -> dict[str, Any]:
        """Queue a signal behind the earlier ones of its name. ``delivery`` dedups one send
        that arrives twice (an update that timed out, then the same signal buffered on the
        server); ``key`` is the sender's idempotency key: a repeat is not queued again."""
        if delivery and delivery in self._deliveries:
            return self._deliveries[delivery]
        if key is not None and key in self._signal_keys:
            res = {"delivered": False, "already_completed": True}
        else:
            # delivered: a suspended wait is there to take it (more waits than signals of
            # the name queued ahead of it); else buffered for a later wait
            waiting_for = f"signal:{name}"
            waiting = sum(
                1
                for st in getattr(self, "_stages", {}).values()
                if st["status"] == "suspended" and st["waiting_for"] == waiting_for
            )
            res = {"delivered": waiting > self._queued(name), "already_completed": False}
            self._signals.append({"name": name, "payload": payload, "idempotency_key": key})
            if key is not None:
                self._signal_keys.add(key)
        if delivery:
            self._deliveries[delivery] = res
        return res

    def _queued(self, name: str) -> int:
        return sum(1 for sig in self._signals if sig["name"] == name)

    def _signal_queues(self) -> dict[str, list[Any]]:
        """The buffered payloads per name, oldest first (what a stage attempt may take)."""
        queues: dict[str, list[Any]] = {}
        for sig in self._signals:
            queues.setdefault(sig["name"], []).append(sig["payload"])
        return queues

    def _lease_signals(self, sid: str) -> dict[str, list[Any]]:
        """The buffered signals for a stage attempt about to run. Only one attempt in flight
        at a time may take from the queue (parallel stages of a group each get a snapshot, so
        two could otherwise take the same signal): the others get none, and a wait of theirs
        suspends until the holder has returned (``_signal_ready``)."""
        if not self._signals or self._signal_holder not in (None, sid):
            return {}
        self._signal_holder = sid
        return self._signal_queues()

    def _signal_ready(self, name: str) -> bool:
        return self._signal_holder is None and self._queued(name) > 0

    def _take_signal(self, name: str) -> None:
        """A stage attempt consumed the oldest buffered signal of ``name``."""
        for i, sig in enumerate(self._signals):
            if sig["name"] == name:
                del self._signals[i]
                return

    def _carry_signals(self, start: dict[str, Any]) -> None:
        """Signals carried over in the start input (an import, a redrive) arrived before any
        this run received; a key among them drops a later duplicate."""
        carried = start.get("signals") or []
        if isinstance(carried, dict):  # the form before signals queued: one per name
            carried = [{"name": n, "payload": p} for n, p in carried.items()]
        earlier = [
            {
                "name": sig["name"],
                "payload": sig.get("payload"),
                "idempotency_key": sig.get("idempotency_key"),
            }
            for sig in carried
        ]
        keys = set(start.get("signal_keys") or [])
        keys |= {sig["idempotency_key"] for sig in earlier if sig["idempotency_key"]}
        self._signals = earlier + [
            sig for sig in self._signals if sig["idempotency_key"] not in keys
        ]
        self._signal_keys |= keys
