"""The signal queue of the interpreter workflow (a base of ``_workflow.GraphWorkflow``).

Signals of one name queue per run in arrival order, as Temporal signals do: the workflow keeps
every buffered signal (``{name, payload, idempotency_key}``, oldest first). A signal's
idempotency key, once seen, is kept for the life of the run, so a repeat is not queued again
(``already_completed``). The engine sends each signal as a Temporal signal of its own name (its
delivery id and idempotency key in the payload's metadata) and learns what became of it from
the signal handler itself when the run's worker is one of the sending engine's own (the
worker's ``DELIVERY_DECIDED`` extern function, ``_waiters``), else asks the run with the
``wfe.internal.delivery`` query, which the signal's own workflow task answers (the
``wfe.internal.signal_status`` update, which needs a task of its own, is its fallback and what
engines before the query sent); older engines sent the ``wfe.signal`` update or a wrapped
body. A raw Temporal signal from an operator (``temporal workflow signal --name go --input
'{...}'``, the Web UI's "Send a Signal", which lists the names the graph declares) queues its
input as the payload.

Any number of stage attempts (the stages of a parallel group) take from the queue at the same
time, each signal exactly once, oldest first per name:

- a running attempt's wait asks for the oldest free signal of its name with the
  ``wfe.internal.take_signal`` update (``on_take_signal``): the run pops it and holds it with
  that attempt (``_held``, per step key, so a retry of a lost try asking for the same step gets
  the same one). An update with nothing to take is rejected by its validator, so it leaves no trace
  in the run's history; the wait then suspends.
- a suspended wait resumes only for a free signal of its name, which is lent to it at once
  (``_reserve``: two waiters never resume for one signal) and handed to the resumed attempt in
  its task. A ``local=True`` attempt, which cannot ask (it runs inside the run's workflow
  task), is lent every free signal when it starts. A lent signal stays in the queue (a frozen
  run's snapshot carries it) but no one else takes it.

When the attempt's result arrives, what its body consumed (``consumed``: a name per lent
signal) leaves the queue, and a held signal whose wait completed stays consumed; any other
lent signal is free again and any other held one goes back to the front of its name's queue
(``_release_taken``), so none is lost. A frozen run and a stale try get nothing.

Runs started before this rule (their history lacks the ``wfe-shared-signal-takes`` patch
marker) keep the old single-taker rule so they replay unchanged: the first attempt in flight
is handed the whole queue (``_lease_signals``) and is the only taker until it reports.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from typing import Any

import pydantic_core
from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from engine_port import ClaimCheck, box_inline

    from ._budget import store_from_task
    from ._carry import meta_of
    from ._freezing import migration_error
    from ._names import (
        DELIVERY_DECIDED,
        INTERNAL,
        SIGNAL_STATUS_QUERY,
        SIGNAL_STATUS_UPDATE,
        SIGNAL_UPDATE,
        TAKE_SIGNAL_UPDATE,
    )
    from ._start import StartDocument
    from ._wire import SIGNALS_CHECKED, spill_key

__all__ = [
    "SIGNAL_STATUS_QUERY",
    "SIGNAL_STATUS_UPDATE",
    "SIGNAL_UPDATE",
    "TAKE_SIGNAL_UPDATE",
    "SignalHandlers",
]

# a signal's payload is JSON (or empty): anything else (bytes, protobuf) is rejected
_JSON_ENCODINGS = frozenset({b"json/plain", b"binary/null"})
_WINDING_DOWN = "the run is compensating (it failed or was cancelled): it takes no more signals"


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
    _start: StartDocument
    _final: bool
    _frozen: bool
    _migrated_to: str | None
    _signals: list[dict[str, Any]]
    _signal_keys: set[str]
    _deliveries: dict[str, dict[str, Any]]
    _calls: dict[str, dict[str, Any]]
    # the signals each stage attempt in flight took with ``wfe.internal.take_signal``, per step key
    _held: dict[str, dict[str, dict[str, Any]]]
    # the signals lent to each stage attempt (reserved by its resumed wait, or handed to a
    # local attempt): still in ``_signals``, by identity, hidden from other takers
    _lent: dict[str, list[dict[str, Any]]]
    # (per stage) the signals lent to a resumed wait, delivered to it (``_unconsumed``)
    _reserved: dict[str, list[dict[str, Any]]]
    # the engine's signals answered buffered (``_answer``) in the workflow task
    # ``_answers_task`` (and, while a local try was in flight, before): each with its delivery
    # id, the task (history length) it came in, whether a stage activity was in flight then,
    # and its number in the order of answers (``_answers_given``). A wait that resumes for one
    # at once may make it delivered (``_delivered_late``)
    _buffered_answers: list[tuple[dict[str, Any], str, int, bool, int]] | None = None
    _answers_task = -1
    _answers_given = 0
    # the deliveries whose answer is not told yet (``_local_window``): the query answers
    # nothing for them
    _withheld: frozenset[str] = frozenset()
    # runs started before shared takes (no ``wfe-shared-signal-takes`` patch marker) keep the
    # old single-taker rule so their histories replay: ``_signal_holder`` is the stage whose
    # attempt in flight was handed the whole queue
    _holder_rule: bool = False
    _signal_holder: str | None = None
    _rejected: list[dict[str, Any]]
    _status: str
    # runs started with ``signal_rule`` (read from the start memo in ``__init__``: a signal
    # may be handled before ``run``): they refuse signals while compensating, and keep an
    # operator's signal over ``_raw_inline_max`` bytes in the BlobStore
    _checks_signals: bool = False
    _raw_inline_max: int | None = None
    # runs started with ``signal_names`` in their start memo: the names an operator's raw
    # signal may carry (another one is rejected and recorded); None: any name
    _signal_names: frozenset[str] | None = None
    # signals handled before the run set up its state (``__init__`` sets [], or None on an
    # execution an older driver continued, which queued them as they came; None once
    # ``_carry_signals`` ran): the first workflow task of an execution hands its signals to
    # the handlers before ``run`` starts. Queued then, without the state they are judged by
    # (the stages waiting, the queue and idempotency keys carried from the execution this
    # one continued from, an import or a redrive), a signal a waiting step was about to
    # take was reported buffered and a sender's retry not already_completed; they are
    # queued, in arrival order, once that state is there
    # (each with whether the run judges it by its bound: an engine's signal, see ``_refusal``;
    # before the run set up, the bound is not judged: ``_start`` and the carried queue are not
    # there yet, so ``_carry_signals`` judges it, on runs with ``StartDocument.bounds_early``)
    _early: list[tuple[str, Any, Any, Any, bool]] | None = None
    # (``GraphWorkflow``) its continue-as-new threshold, and the waits ended in this execution
    _continue_after: int | None = None
    _waits_ended: int = 0
    _takes = 0  # the takes this execution handled (each a Temporal update)

    def _read_signal_rule(self, start_memo: Any) -> None:
        """(``__init__``) The signal rule of the run, from its ``wfe_start`` memo entry."""
        if not isinstance(start_memo, dict) or start_memo.get("signal_rule") != SIGNALS_CHECKED:
            return
        names = start_memo.get("signal_names")
        if isinstance(names, list) and names:
            self._signal_names = frozenset(str(n) for n in names)
        self._checks_signals = True
        threshold = start_memo.get("spill_threshold")
        self._raw_inline_max = threshold if isinstance(threshold, int) else None

    def _winding_down(self) -> bool:
        """The run compensates (a stage failed for good, or it was cancelled) and, started
        with the signal rule, takes no more signals, as on the native driver."""
        return self._checks_signals and self._status == "compensating"

    @workflow.signal(dynamic=True)
    def on_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """A Temporal signal: its input is the payload, as the sender gave it. The engine's
        own (``TemporalEngine.signal``) carry their delivery id and idempotency key in the
        payload's metadata (``_carry``); a raw one from an operator (``temporal workflow
        signal --name go --input '{...}'``) has none. A payload that does not decode (not
        JSON) is rejected and recorded (``_rejected``) without failing the workflow task, and
        so is a raw one whose name the graph does not declare (runs started with the
        ``signal_names`` of their start memo; a graph that declares none takes any name).
        Older engines sent a wrapped body (``_is_wrapped``), still read so runs replay."""
        value: Any = None
        meta = meta_of(args[0].payload) if args else None
        try:
            if args:
                encoding = args[0].payload.metadata.get("encoding", b"")
                if encoding not in _JSON_ENCODINGS:
                    raise ValueError(f"encoding {encoding.decode(errors='replace')!r} is not JSON")
                value = workflow.payload_converter().from_payload(args[0].payload)
        except Exception as exc:
            self._reject(name, f"its payload does not decode: {type(exc).__name__}: {exc}")
            if meta is not None and isinstance(meta.get("delivery"), str):
                self._decided(meta["delivery"], {"rejected": "InvalidSignalPayload"})
            return
        if meta is not None:
            delivery, key = meta.get("delivery"), meta.get("idempotency_key")
            refused = self._refusal(delivery, key)
            if refused is not None:
                self._reject(name, refused)
                if isinstance(delivery, str):
                    self._decided(delivery, self._refused(refused))
                return
            self._arrived(name, value, delivery, key, bounded=True)  # as the engine stored it
        elif _is_wrapped(value):
            self._arrived(
                name, value.get("payload"), value.get("delivery"), value.get("idempotency_key")
            )
        elif self._winding_down():
            self._reject(name, _WINDING_DOWN)
        elif self._signal_names is not None and name not in self._signal_names:
            # no wait could take it (a wait for an undeclared name fails at once), and
            # ``engine.signal`` refuses the name: tell the operator rather than queue it
            declared = ", ".join(sorted(self._signal_names))
            self._reject(name, f"no stage of the run's graph declares it (declared: {declared})")
        else:
            # the operator's JSON is user data: boxed, so it is never read as a reference
            self._arrived(name, self._stored_raw(value), None, None)

    def _arrived(
        self, name: str, payload: Any, delivery: Any, key: Any, bounded: bool = False
    ) -> None:
        """A signal to queue (``_deliver``), or, before the run set up, to queue once it did
        (``_early``, see ``_carry_signals``; ``bounded``: an engine's signal, which the run's
        ``max_pending_signals`` bound applies to)."""
        if self._early is not None:
            self._early.append((name, payload, delivery, key, bounded))
        else:
            self._deliver(name, payload, delivery, key)

    def _stored_raw(self, value: Any) -> Any:
        """The stored form of an operator's signal payload: inline (boxed) up to the run's
        spill threshold; above it a claim-check reference to the payload, which the worker
        running this workflow task stores in the BlobStore (the ``SIGNAL_STORED`` extern
        function; a replay only rebuilds the reference: the key is the payload's hash), so
        that the activities that take it never carry it (DESIGN §5: no Temporal payload
        carries a large value; one near Temporal's 2 MiB limit made every workflow task that
        lent it to a stage fail). A store that fails fails the workflow task, which Temporal
        runs again, signal and all."""
        limit = self._raw_inline_max
        if limit is None:
            return box_inline(value)
        data = pydantic_core.to_json(value)
        if len(data) <= limit:
            return box_inline(value)
        digest = hashlib.sha256(data).hexdigest()
        run_id = self._run_id or workflow.info().workflow_id
        key = spill_key(run_id, "signals", f"raw-{digest[:32]}")
        store_from_task(run_id, key, data, "a signal")
        return ClaimCheck.reference(key, data)

    def _refusal(self, delivery: Any, key: Any) -> str | None:
        """Why an engine-sent signal is not queued (the engine's ``signal`` reports it), or
        None: the run ended or is frozen, or its queue is full."""
        if self._final or self._migrated_to is not None or self._winding_down():
            return "RunNotActiveError"
        if self._frozen:
            return "MigrationError"
        # (a signal that arrives with the run's first task may be handled before ``run``:
        # no ``_start`` yet, and its queue not loaded; ``_carry_signals`` judges the bound)
        start: StartDocument | None = getattr(self, "_start", None)
        return self._full(None if start is None else start.max_pending_signals, delivery, key)

    def _full(self, bound: int | None, delivery: Any, key: Any) -> str | None:
        """``"SignalQueueFullError"`` when the run holds ``bound`` unconsumed signals and this
        one is no repeat (of a delivery or an idempotency key it has seen), else None."""
        repeat = delivery in self._deliveries or (key is not None and key in self._signal_keys)
        if bound is not None and not repeat and self._unconsumed() >= int(bound):
            return "SignalQueueFullError"
        return None

    def _unconsumed(self) -> int:
        """The signals the run holds that count toward ``max_pending_signals``: its queue,
        less (runs with ``StartDocument.frees_taken``) the ones lent to a resumed wait. The
        wait took it (``delivered``): on the native driver it is consumed in the very
        transaction that queued it, so it no longer counts while the attempt runs, nor
        after the attempt failed (its wait is journaled; the retry gets it again)."""
        start: StartDocument | None = getattr(self, "_start", None)
        if start is None or not start.frees_taken:
            return len(self._signals)
        taken = [sig for sigs in self._reserved.values() for sig in sigs]
        return sum(1 for sig in self._signals if not any(sig is t for t in taken))

    def _refused(self, why: str) -> dict[str, Any]:
        """What the engine's ``signal`` hears of a signal the run refused: why, and for a
        full queue the run's own bound (the starting engine's ``max_pending_signals``, which
        the sending engine's settings need not match)."""
        start: StartDocument | None = getattr(self, "_start", None)
        if why == "SignalQueueFullError" and start is not None:
            return {"rejected": why, "bound": start.max_pending_signals}
        return {"rejected": why}

    def _reject(self, name: str, why: str) -> None:
        """Record a signal the run did not queue (the run's memo, ``wfe_rejected_signals``,
        keeps the last ones) and log it; the run goes on."""
        workflow.logger.warning("signal %r rejected by run %s: %s", name, self._run_id, why)
        self._rejected = [*self._rejected[-9:], {"name": name, "reason": why}]
        workflow.upsert_memo({"wfe_rejected_signals": self._rejected})

    @workflow.update(name=SIGNAL_STATUS_UPDATE, description=INTERNAL)
    async def on_signal_status(self, delivery: str) -> dict[str, Any]:
        """(Internal, used by ``TemporalEngine.signal``.) What became of the signal the
        engine sent with this delivery id: delivered, buffered, already completed or why it
        was rejected. Waits for the signal, which the server hands over first."""
        await workflow.wait_condition(lambda: delivery in self._deliveries)
        return self._deliveries[delivery]

    @workflow.query(name=SIGNAL_STATUS_QUERY, description=INTERNAL)
    def on_delivery(self, delivery: str) -> dict[str, Any] | None:
        """(Internal, used by ``TemporalEngine.signal``.) What became of the signal the
        engine sent with this delivery id, or None while the run has not seen it. Asked
        right after the signal: Temporal answers a query once the workflow task that holds
        the events recorded before it completed, so the signal's own task answers it (no
        task of its own, nothing in the history, unlike ``on_signal_status``); None too
        while its answer is withheld (``_local_window``)."""
        if delivery in self._withheld:
            return None
        return self._deliveries.get(delivery)

    def on_signal_update(self, body: dict[str, Any]) -> dict[str, Any]:
        """The ``wfe.signal`` update of older engines (registered for runs started before the
        ``wfe.internal.*`` names only: ``GraphWorkflow._serve_old_names``)."""
        return self._deliver(
            body["name"], body.get("payload"), body.get("delivery"), body.get("idempotency_key")
        )

    def _validate_signal(self, body: dict[str, Any]) -> None:
        if self._final or self._migrated_to is not None:
            raise ApplicationError("run is no longer active", type="RunNotActiveError")
        if self._frozen:
            raise migration_error(
                f"run {self._run_id!r} is frozen for migration; signal it once the move "
                "completed (on its target) or was aborted"
            )
        bound = self._start.max_pending_signals
        repeat = body.get("delivery") in self._deliveries or (
            body.get("idempotency_key") is not None
            and body.get("idempotency_key") in self._signal_keys
        )
        if bound is not None and not repeat and self._unconsumed() >= int(bound):
            # refused by the validator: nothing enters the history (SignalQueueFullError)
            raise ApplicationError(
                f"run {self._run_id!r} holds {self._unconsumed()} unconsumed signals "
                f"(max_pending_signals={bound})",
                type="SignalQueueFullError",
                non_retryable=True,
            )

    def _deliver(
        self, name: str, payload: Any, delivery: str | None, key: str | None
    ) -> dict[str, Any]:
        """Queue a signal behind the earlier ones of its name. ``delivery`` dedups one send
        that arrives twice (an update that timed out, then the same signal buffered on the
        server); ``key`` is the sender's idempotency key: a repeat is not queued again."""
        if delivery and delivery in self._deliveries:
            return self._deliveries[delivery]
        sig: dict[str, Any] | None = None
        if key is not None and key in self._signal_keys:
            res = {"delivered": False, "already_completed": True}
        else:
            # delivered: a suspended wait is there to take it (more waits than signals of
            # the name queued ahead of it); else buffered for a later wait
            waiting_for = f"signal:{name}"
            waiting = sum(
                1
                for st in getattr(self, "_stages", {}).values()
                if st.status == "suspended" and st.waiting_for == waiting_for
            )
            res = {"delivered": waiting > self._queued(name), "already_completed": False}
            sig = {"name": name, "payload": payload, "idempotency_key": key}
            self._signals.append(sig)
            if key is not None:
                self._signal_keys.add(key)
        if delivery:
            self._answer(delivery, res, sig)
        return res

    def _answer(self, delivery: str, res: dict[str, Any], sig: dict[str, Any] | None) -> None:
        """Record what became of an engine's signal (``_decided``). A signal queued for a
        later wait is kept in mind (``_buffered_answers``): a wait that suspended where the
        signal's sender saw it waiting may still resume for it at once (``_delivered_late``),
        and then it was delivered, as on the native driver. That happens when the server
        refused the completion of the task that recorded the suspension and continued the
        run as new, because the signal arrived meanwhile (UnhandledCommand): the task runs
        again with the signal in it, after its worker had delivered the stage.suspended
        event (the stage visibly waited), and the signal meets the stage still running:

        - a stage activity's: temporalio hands a task's signals to their handlers before the
          results of its activities (here the result that suspended the stage);
        - a ``local=True`` stage's: its local activity's result was not recorded (the
          refused task was to record it), so it runs again, scheduled after the signal
          handler ran (a signal that came with the run's first task: once the run set up,
          ``_carry_signals``) or while it runs (the try was scheduled in a task the history
          holds, where its run is replayed), and reads back the suspension its first run
          journaled (``_activities._Recorded``: the result marked ``again``).

        The engine hears the task's last word (``_waiters``: told once the activation
        ended); while a local try is in flight it hears nothing of a buffered answer until
        the try's result came (``_local_window``). Answers of earlier tasks are forgotten,
        except while a local try is in flight (its result may come in a later task). No
        command depends on any of this: the fix needs no start document mark."""
        self._decided(delivery, res)
        if sig is None or res.get("delivered") or not workflow.in_workflow():
            return  # (``_early``: the engine judges a signal from the run's history)
        task = workflow.info().get_current_history_length()
        inflight = bool(getattr(self, "_calls", None))
        local = bool(getattr(self, "_locals", 0))
        if local:
            self._tell(delivery, None)  # (told once the local try's result came)
        if self._buffered_answers is None or (task != self._answers_task and not local):
            self._buffered_answers = []
        self._answers_task = task
        self._answers_given += 1
        self._buffered_answers.append((sig, delivery, task, inflight, self._answers_given))

    def _refuse_unheard(self, outcome: str) -> None:
        """The run ends (``outcome``) in this workflow task: a signal answered buffered in it
        that no wait took is refused instead (``engine.signal`` raises ``RunNotActiveError``),
        as on the native driver, where a signal that comes after the run's last outcome finds
        it ended. temporalio hands a task's signals to their handlers before the results of
        its activities, so a signal that reached Temporal after the outcome that ends the run
        (or while the task that records it ran, which the server then refuses and hands out
        again with the signal) was answered ``buffered`` by a run that would never take it.
        A signal that came before that outcome ends the same way (the run ends with it
        untaken, nothing in the run's events tells the two apart), so both are refused.
        Answers of earlier tasks stand (the run was waiting then); no command depends on it."""
        if not self._buffered_answers:
            return
        task = workflow.info().get_current_history_length()
        for sig, delivery, at, _, _ in self._buffered_answers:
            if at == task and any(s is sig for s in self._signals):
                self._decided(delivery, {"rejected": "RunEnded", "status": outcome})
        self._buffered_answers = None

    def _local_window(self, task: int, names: frozenset[str] | None) -> int:
        """A local try is scheduled in ``task``; its waits may be for ``names`` (None: any).
        The answers from here on, and the ones given buffered earlier in this task (the
        signal handlers of a task run before the coroutines that schedule), are the ones a
        wait that resumes at once after the try's suspension, read back, may deliver
        (``_delivered_late``: the number of the first returned). Of those, the ones already
        given to signals the try may wait for are not told yet (the engine hears an
        activation's last word: ``_waiters``; the try's result comes in a later one): the
        try's caller tells them once its result came (``_tell_since``); until then
        ``engine.signal`` waits for them (or asks the run, which answers once its task
        ended)."""
        window = self._answers_given + 1
        for sig, delivery, at, _, n in self._buffered_answers or ():
            if at == task:
                window = min(window, n)
                if names is None or sig["name"] in names:
                    self._tell(delivery, None)
        return window

    def _tell_since(self, window: int) -> None:
        """Tell the buffered answers given from ``window`` on (``_local_window``): what the
        run made of them so far (a wait that resumes for one later in this activation has
        the last word)."""
        for _, delivery, _, _, n in self._buffered_answers or ():
            res = self._deliveries.get(delivery)
            if n >= window and res is not None:
                self._tell(delivery, dict(res))

    def _delivered_late(self, sig: dict[str, Any], again: int | None) -> None:
        """A wait resumes for ``sig`` (``_reserve``) at once after it suspended: it was
        delivered to that wait if it was answered buffered (``_answer``) in this very
        workflow task while a stage activity was in flight, or, the wait's suspension being
        a local try's read back, from the try's window on (``again``, ``_local_window``):
        that try ran before, in an attempt of the task that was refused or lost, and
        suspended without the signal, which it would have been lent had it been free when
        the try started. A signal buffered before a stage started is never delivered so: a
        ``local=True`` attempt is lent it and takes it without suspending, a regular one
        takes it with ``wfe.internal.take_signal``."""
        if not self._buffered_answers:
            return
        task = workflow.info().get_current_history_length()
        late = [
            p
            for p in self._buffered_answers
            if p[0] is sig and ((p[3] and p[2] == task) or (again is not None and p[4] >= again))
        ]
        if not late:
            return
        self._buffered_answers = [
            p for p in self._buffered_answers if not any(p is q for q in late)
        ]
        for p in late:
            self._decided(p[1], {"delivered": True, "already_completed": False})

    def _decided(self, delivery: str, res: dict[str, Any]) -> None:
        """Record what became of the signal sent with ``delivery`` (the query reads it) and
        tell the engine that waits for it (``_tell``)."""
        self._deliveries[delivery] = res
        self._tell(delivery, dict(res))

    def _tell(self, delivery: str, res: dict[str, Any] | None) -> None:
        """When this is not a replay, tell an engine in this worker's process that waits for
        the signal sent with ``delivery`` what became of it (the worker's
        ``DELIVERY_DECIDED`` extern function, ``_waiters``; absent on a worker another
        driver built); None: not yet (``_local_window``: until then the query answers
        nothing either, and the update waits). The call issues no command and its result is
        not used: the workflow does the same whether or not anyone hears it."""
        if res is None:
            self._withheld = self._withheld | {delivery}
        elif delivery in self._withheld:
            self._withheld = self._withheld - {delivery}
        if workflow.unsafe.is_replaying():
            return
        tell = workflow.extern_functions().get(DELIVERY_DECIDED)
        if tell is not None:
            with contextlib.suppress(Exception):
                tell(delivery, res)

    @workflow.update(name=TAKE_SIGNAL_UPDATE, description=INTERNAL)
    def on_take_signal(self, body: dict[str, Any]) -> dict[str, Any]:
        """A stage attempt's wait asks for the oldest free signal ``name`` (see the module
        docstring; ``given`` only counts on a run started before shared takes)."""
        self._takes += 1
        if not self._may_take(body):
            return {"taken": False}
        held = self._held.setdefault(body["stage"], {})
        sig = held.get(body["key"])
        if sig is None:
            i = self._nth(body["name"], self._skip(body))
            if i is None:
                return {"taken": False}
            sig = held[body["key"]] = self._signals.pop(i)
        return {"taken": True, "payload": sig["payload"]}

    @on_take_signal.validator
    def _validate_take(self, body: dict[str, Any]) -> None:
        if not self._may_take(body):
            raise ApplicationError("no signal to take: the wait suspends", type="NothingToTake")

    def _takes_held(self) -> bool:
        """Whether takes wait for a continue-as-new (runs with
        ``StartDocument.takes_per_execution`` that may continue, ``_continue_after``): this
        execution handled that many, or Temporal suggests continuing (a long history; past
        a share of the updates an execution may receive, on a server configured so). Each
        take is an update: past the limit Temporal refused the next one and the attempt,
        never at a safe point, could not go on in a new execution. Now a take answers
        nothing (the wait suspends, its journal keeping what the attempt took) and no
        suspended wait resumes for a signal, so the run reaches a safe point and continues;
        the new execution resumes the waits. From the workflow task's started event: the
        same on a replay."""
        start: StartDocument | None = getattr(self, "_start", None)
        if start is None or start.takes_per_execution is None or self._continue_after is None:
            return False
        if start.continued and not self._waits_ended:
            return False  # (it may not continue yet: ``GraphWorkflow._may_continue``)
        if self._takes >= start.takes_per_execution:
            return True
        return workflow.info().is_continue_as_new_suggested()

    def _may_take(self, body: dict[str, Any]) -> bool:
        sid = body.get("stage")
        call = self._calls.get(sid) if isinstance(sid, str) else None
        if call is None or call["token"] != body.get("token"):
            return False  # a try of an attempt that already reported
        if self._final or self._frozen or self._migrated_to is not None:
            return False  # a frozen run hands out nothing: its snapshot keeps the queue
        if body.get("key") in self._held.get(str(sid), {}):
            return True
        if self._holder_rule and self._signal_holder not in (None, sid):
            return False  # (runs started before shared takes) another attempt holds the queue
        if self._takes_held():
            return False  # the run continues as new first: the wait suspends
        return self._nth(str(body.get("name")), self._skip(body)) is not None

    def _skip(self, body: dict[str, Any]) -> int:
        # a run with the holder rule leaves the signals it handed out in the queue: a take
        # skips the ``given`` ones; otherwise lent signals are skipped by ``_nth`` itself
        return int(body.get("given") or 0) if self._holder_rule else 0

    def _is_lent(self, sig: dict[str, Any]) -> bool:
        return any(s is sig for lent in self._lent.values() for s in lent)

    def _nth(self, name: str, skip: int) -> int | None:
        """The index in the queue of the free (not lent) signal ``name`` after the first
        ``skip`` of them."""
        for i, sig in enumerate(self._signals):
            if sig["name"] == name and not self._is_lent(sig):
                if skip == 0:
                    return i
                skip -= 1
        return None

    def _release_taken(self, sid: str, steps: dict[str, dict[str, Any]]) -> None:
        """The attempt of ``sid`` reported (or ended without a result): each signal it took
        with ``wfe.internal.take_signal`` whose wait step completed stays consumed; any other goes
        back in front of the queued signals of its name, in the order it was taken."""
        held = self._held.pop(sid, None)
        if not held:
            return
        back = [sig for key, sig in held.items() if not (steps.get(key) or {}).get("completed")]
        for sig in reversed(back):
            i = next(
                (j for j, s in enumerate(self._signals) if s["name"] == sig["name"]),
                len(self._signals),
            )
            self._signals.insert(i, sig)

    def _queued(self, name: str) -> int:
        """How many signals ``name`` are free to take (buffered, not lent to an attempt)."""
        return sum(1 for sig in self._signals if sig["name"] == name and not self._is_lent(sig))

    def _signal_ready(self, name: str) -> bool:
        if self._holder_rule and self._signal_holder is not None:
            return False
        if self._takes_held():
            return False  # (the wait resumes in the execution the run continues in)
        return self._queued(name) > 0

    def _reserve(self, sid: str, name: str, again: int | None = None) -> bool:
        """A suspended wait of ``sid`` for ``name`` resumes: lend it the oldest free signal of
        the name, at once, so two waiters never resume for one signal (``again``: the wait's
        suspension is a local try's read back: its window, see ``_delivered_late``)."""
        if self._takes_held():
            return False
        i = self._nth(name, 0)
        if i is None:
            return False
        sig = self._signals[i]
        self._lent.setdefault(sid, []).append(sig)
        self._reserved.setdefault(sid, []).append(sig)
        self._delivered_late(sig, again)
        return True

    def _lend(self, sid: str, local: bool) -> dict[str, list[Any]]:
        """The signals a stage attempt about to run is handed in its task (per name, oldest
        first): the one its resumed wait reserved, and for a ``local`` attempt (which cannot
        ask its run: it runs inside the run's workflow task) every free one. A lent signal
        stays in the queue, hidden from other takers, until the attempt reports."""
        if self._holder_rule:
            return self._lease_signals(sid)
        lent = self._lent.setdefault(sid, [])
        if local:
            lent.extend(s for s in self._signals if not self._is_lent(s))
        queues: dict[str, list[Any]] = {}
        for sig in self._signals:
            if any(s is sig for s in lent):
                queues.setdefault(sig["name"], []).append(sig["payload"])
        if not lent:
            del self._lent[sid]
        return queues

    def _settle_lent(self, sid: str, consumed: Sequence[str]) -> None:
        """The attempt of ``sid`` reported: per name it ``consumed`` from its task, the oldest
        signal lent to it leaves the queue (on a run with the holder rule, which lends
        nothing, the oldest queued one); the rest of what it was lent is free again."""
        lent = self._lent.pop(sid, [])
        self._reserved.pop(sid, None)
        for name in consumed:
            # the task listed what it lent in queue order, so the body took the first of them
            i = next(
                (
                    j
                    for j, s in enumerate(self._signals)
                    if s["name"] == name and any(s is x for x in lent)
                ),
                None,
            )
            if i is None:
                i = self._nth(name, 0)
                if i is None:
                    continue
            sig = self._signals.pop(i)
            lent = [s for s in lent if s is not sig]

    def _unlend(self, sid: str) -> None:
        """The stage ended without running the attempt it reserved for: free the signal."""
        self._lent.pop(sid, None)
        self._reserved.pop(sid, None)

    def _lease_signals(self, sid: str) -> dict[str, list[Any]]:
        """(Runs started before shared takes only.) The whole queue for the first attempt in
        flight, which becomes its only taker until it reports; the others get none."""
        if not self._signals or self._signal_holder not in (None, sid):
            return {}
        self._signal_holder = sid
        queues: dict[str, list[Any]] = {}
        for sig in self._signals:
            queues.setdefault(sig["name"], []).append(sig["payload"])
        return queues

    def _carry_signals(self, start: StartDocument) -> None:
        """Signals carried over in the start input (an import, a redrive, a continue-as-new)
        arrived before any this run received; a key among them drops a later duplicate.
        Then the signals that arrived before the run set up (``_early``) are queued behind
        them, each judged and its result recorded as if it came now (called once the stages
        and the deliveries carried over are in place)."""
        carried = start.signals
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
        keys = set(start.signal_keys)
        keys |= {sig["idempotency_key"] for sig in earlier if sig["idempotency_key"]}
        self._signals = earlier + [
            sig for sig in self._signals if sig["idempotency_key"] not in keys
        ]
        self._signal_keys |= keys
        # The bound (``max_pending_signals``) is judged here for the signals that came
        # before the set-up, against the carried queue and the keys now in place: judged on
        # arrival, they met an empty queue (the carried one not loaded, ``_start`` not set),
        # so a burst in the gap of a continue all went in and the run held more than its
        # bound. Replay-safe: only on executions whose start document has ``bounds_early``
        # (set by ``GraphWorkflow._continue`` of the code that has this rule); an execution
        # continued before queues them all, as it did. On a run's first execution only with
        # ``bounds_first`` (runs started since 2026-12-06): a burst of signals to a run whose
        # first task had not run (no worker yet, or a slow first task) all went in, past the
        # bound; the engine now reads their fate from the history (``_early.judged``) or asks
        # the run, rather than report a keyless one buffered without asking.
        judged = start.bounds_early or start.bounds_first
        bound = start.max_pending_signals if judged else None
        early, self._early = self._early or [], None
        for name, payload, delivery, key, bounded in early:
            refused = self._full(bound, delivery, key) if bounded else None
            if refused is not None:
                self._reject(name, refused)
                if isinstance(delivery, str):
                    self._decided(delivery, self._refused(refused))
                continue
            self._deliver(name, payload, delivery, key)
