"""Plain-JSON shapes exchanged between the client, the workflow and the activities.

Every Temporal payload of this driver is a small JSON document; large values travel as
claim-check references (``engine_port.ClaimCheck``) into the shared BlobStore.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from datetime import datetime
from typing import Any

from engine_port import StepRecord

__all__ = [
    "BLOB_KEYS_CASE_SAFE",
    "CARRY_BUDGET",
    "CLOCK_FROM_LOCALS",
    "CONTINUE_HOLDS_TIMERS",
    "EVENTS_VIA_ACTIVITIES",
    "EVENTS_VIA_ONE_CARRIER",
    "LOCAL_CHAINS",
    "MEMO_SHAPE_COMPACT",
    "MEMO_WRITES_AFTER_LOCALS",
    "MEMO_WRITES_ON_CHANGE",
    "OLD_OUTBOX_RULE",
    "PARKING_WHEN_SLOW",
    "PUBLISH_BY_WORKER",
    "RESULT_WITH_RUN_INFO",
    "RUN_END_BY_WORKER",
    "SIGNALS_CHECKED",
    "STAGE_ATTRIBUTE_WAITS",
    "SUSPENSION_IDS_BY_STEP",
    "TAKES_PER_EXECUTION",
    "deployment_for",
    "dlq_key",
    "fingerprint",
    "journal_key",
    "journal_log_key",
    "journal_prefix",
    "journal_run_prefix",
    "journal_stage_part",
    "new_run_id",
    "outbox_batch_key",
    "outbox_key",
    "outbox_prefix",
    "parse_time",
    "record_from_json",
    "record_to_json",
    "run_id_for_key",
    "spill_key",
    "state_key",
    "task_queue_for",
]

# the start document's ``events_via`` of runs whose stage activities carry their events
EVENTS_VIA_ACTIVITIES = "activities"
# ... and of runs where one such activity is in flight at a time (siblings of a fan-out carry
# nothing; runs marked "activities" keep every sibling carrying, so their histories replay)
EVENTS_VIA_ONE_CARRIER = "one-carrier"
# the start document's ``memo_writes`` of runs that write their memo and search attributes
# only once no local activity is in flight (``_inspection``); absent: after every activation
MEMO_WRITES_AFTER_LOCALS = "after-locals"
# ... and of runs that, besides, write their memo only when what a reader of the memo alone
# acts on changes (status, the stages it waits or failed in, a freeze, its end): not at every
# stage that starts or completes, each a visibility write the server indexes (the stages in
# between: ``get_run`` asks the run, ``RunMemo.stages_lag``)
MEMO_WRITES_ON_CHANGE = "on-change"
# the start document's ``result`` of runs whose completion result carries the run's final
# ``wfe_run`` memo in its payload's metadata, so ``wait()`` reads the RunInfo from the close
# event it long-polls (no describe after it); absent: the output alone
RESULT_WITH_RUN_INFO = "output+run-info"
# the start document's ``stage_attribute`` of runs whose ``WfeStage`` search attribute names the
# stages the run waits in (suspended: a signal, a timer, an event) or failed in, and is empty
# while its stages merely run: such a run writes its search attributes when its status or those
# stages change, not at every stage it starts (``_inspection``); absent: the stages running or
# suspended
STAGE_ATTRIBUTE_WAITS = "waits+failed"
# the start document's ``parking`` of runs whose stage activities, on a worker with no event
# sink, park the small batch they carry only once their stage has run a while
# (``_activities.PARK_AFTER_S``) and otherwise hand it back to the run (``_outbox``); absent:
# parked at once
PARKING_WHEN_SLOW = "when-slow"
# the start document's ``run_end`` of runs whose last workflow task has its worker store their
# final state and deliver their last events (the ``RUN_ENDED`` extern function, ``_run_end``)
# before the task completes; absent: the ``wfe.save_state`` local activity does
RUN_END_BY_WORKER = "worker"
# the start document's ``publish`` of runs whose events no activity carries (a sibling of a
# fan-out that ended, a stage that suspended) are handed to the worker running the workflow
# task (the ``EVENTS_HANDED`` extern function, ``_run_end``), which delivers or keeps them
# before the task completes; absent: the ``wfe.publish`` local activity does
PUBLISH_BY_WORKER = "worker"
# the start document's ``local`` of runs whose consecutive ``local=True`` stages run as one
# local activity (``GraphWorkflow._chain``: the stages after the first one that are alone in
# their group and have not started yet); absent: one local activity per stage attempt
LOCAL_CHAINS = "chains"
# the start document's ``memo_shape`` of runs whose ``wfe_run`` memo lists each stage with its
# id, status and the fields that are set only (``StageState.memo``): Temporal writes a run's
# memo again at every change of the run; absent: every field of every stage
MEMO_SHAPE_COMPACT = "compact"
# the start document's ``signal_rule`` of runs that refuse a signal once they wind down
# (compensating after a failure or a cancel: the native driver refuses it too) and keep an
# operator's raw signal over their ``spill_threshold`` in the BlobStore, behind a reference,
# like one ``engine.signal`` sends (``SignalHandlers.on_signal``); absent: both queued as given
SIGNALS_CHECKED = "checked"
# the start document's ``continue_hold`` of runs (started since 2026-12-06) that hold a
# continue-as-new while a wait whose timer was set for a second or more falls due within
# ~1.5 s (2.5 s in an execution younger than a second: ``GraphWorkflow._due_before_next``);
# absent: only in an execution younger than a second, for a timer due within that second
CONTINUE_HOLDS_TIMERS = "timers"
# the start document's ``suspension_ids`` of runs (started since 2026-12-06) whose
# stage.suspended ids name the wait (its step key and deadline: ``Lifecycle.stage_suspended``);
# absent: numbered by the attempt's suspensions so far, as their code emitted them
SUSPENSION_IDS_BY_STEP = "steps"
# the start document's ``blob_keys`` of runs (started since 2026-12-06) whose blob keys made
# of a stage id or a step name stay apart on a case-insensitive store (a folder store on macOS
# or Windows): a part with an upper-case letter gets a hash of its exact spelling appended
# (``_part``), so stages ``A`` and ``a`` no longer share one journal, nor steps ``Charge`` and
# ``charge`` one spilled result; absent: the parts as they are (where their code put them)
BLOB_KEYS_CASE_SAFE = "case-safe"
# the start document's ``clock`` of runs (started since 2026-12-06) whose times (events, stage
# and run times, deadlines) in a workflow activation where a local activity reported come from
# that local activity: the run's clock when it scheduled it plus the run time its result
# reports (``_clock.RunClock``), the same live and on replay; absent: the activation's time
# (``workflow.now()``), which sdk-core gives differently on replay when a query made it
# complete the task that ran the local activity early
CLOCK_FROM_LOCALS = "locals"
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]")


def fingerprint(workflow_id: str, value: Any) -> str:
    """A stable hash of a workflow id and its JSON input (keys sorted)."""
    canon = json.dumps(
        [workflow_id, value], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canon.encode()).hexdigest()


def run_id_for_key(key: str) -> str:
    """The run (Temporal workflow) id derived from an idempotency key."""
    return "idem-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def new_run_id() -> str:
    return uuid.uuid4().hex


def task_queue_for(base: str, workflow_id: str) -> str:
    """The task queue of one workflow; its versions are Worker Deployment versions on it."""
    return f"{base}-{workflow_id}"


def deployment_for(task_queue: str) -> str:
    """The Worker Deployment of a task queue (deployment names may not contain '.')."""
    return task_queue.replace(".", "_")


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


TAKES_PER_EXECUTION = 1_500
"""(``StartDocument.takes_per_execution``) The most signals the running attempts of one
execution take (each a Temporal update: the dev server lets an execution receive 2,000, its
``history.maxTotalUpdates``) before the run continues as new, with room for the run's other
updates (a freeze, a signal's status)."""

CARRY_BUDGET = 1_000_000
"""(``StartDocument.carry_budget``) The most bytes of business values (run input, upstream
outputs, a compensated output) the stage activities of one workflow task carry inline: well
under Temporal's 4 MB completion and 2 MiB payload limits, with room for the rest of each
activity's input."""


def spill_key(run_id: str, *parts: object, case_safe: bool = False) -> str:
    """A blob key under ``runs/<run>/``; free-form parts are hashed so keys stay safe, and
    with ``case_safe`` (a run with ``blob_keys``) a part with an upper-case letter gets the
    hash of its exact spelling appended (``_part``)."""
    safe = [
        (_part(p, case_safe) if p else p)
        if isinstance(p, str) and _UNSAFE.sub("", p) == p
        else _hash(str(p))
        for p in parts
    ]
    return "/".join(["runs", run_id, *safe]) + ".json"


def _safe(part: str) -> str:
    return part if part and _UNSAFE.sub("", part) == part else _hash(part)


def _part(part: str, case_safe: bool) -> str:
    """One key part made of a name (a stage id, a step name). ``case_safe``: unique whatever
    the case, as a case-insensitive filesystem compares names (the folder store on macOS,
    Windows): a name with an upper-case letter becomes ``<name>.<hash of the name>``. A name
    without one stays as it is, and holds no '.' (nor does a hash): no two names give parts
    equal under ``.lower()``. Without: the name as it is when safe (runs started before
    ``blob_keys``: ``A`` and ``a`` shared one part there)."""
    safe = _safe(part)
    if not case_safe or safe != part or part.lower() == part:
        return safe
    return f"{part}.{_hash(part)[:12]}"


def journal_run_prefix(run_id: str) -> str:
    """Where every step journal of a run lives (each stage's, each redrive's)."""
    return f"runs/{_safe(run_id)}/steps/"


def journal_stage_part(stage_id: str, case_safe: bool = False) -> str:
    """The folder of a stage's journals under ``journal_run_prefix`` (``case_safe``: a run
    with ``blob_keys``)."""
    return _part(stage_id, case_safe)


def journal_prefix(
    run_id: str, stage_id: str, redrive: int, kind: str, *, case_safe: bool = False
) -> str:
    """Where one stage's step journal lives (``kind`` = ``stage`` or ``compensate``):
    ``<journal_run_prefix><journal_stage_part>/r<redrive>/<kind>/``."""
    part = journal_stage_part(stage_id, case_safe)
    return f"{journal_run_prefix(run_id)}{part}/r{int(redrive)}/{kind}/"


def journal_key(prefix: str, step_name: str, case_safe: bool = False) -> str:
    """One step's record as its own blob (stores that cannot append)."""
    return f"{prefix}{_part(step_name, case_safe)}.json"


def journal_log_key(prefix: str) -> str:
    """The append-only JSON-lines journal (folder stores); no step name maps to it."""
    return f"{prefix}journal.jsonl"


def state_key(run_id: str) -> str:
    return f"runs/{run_id}/state.json"


def dlq_key(run_id: str, seq: int, event_id: str) -> str:
    return f"dlq/{run_id}/{seq:010d}-{event_id}.json"


def outbox_prefix(run_id: str) -> str:
    return f"outbox/{_safe(run_id)}/"


def outbox_key(run_id: str, seq: int, event_id: str) -> str:
    """One parked event (workers before batches parked each event under its own key)."""
    return f"{outbox_prefix(run_id)}{seq:010d}-{_safe(event_id)}.json"


def outbox_batch_key(run_id: str, first_seq: int, last_seq: int) -> str:
    """A batch of parked events, ``first_seq`` to ``last_seq`` (a JSON list)."""
    return f"{outbox_prefix(run_id)}{first_seq:010d}-to-{last_seq:010d}.json"


def parse_time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def record_to_json(rec: StepRecord) -> dict[str, Any]:
    return {
        "name": rec.name,
        "kind": rec.kind,
        "completed": rec.completed,
        "result": rec.result,
        "deadline": None if rec.deadline is None else rec.deadline.isoformat(),
        "signal": rec.signal,
        "meta": rec.meta,
    }


def record_from_json(data: dict[str, Any]) -> StepRecord:
    return StepRecord(
        name=data["name"],
        kind=data["kind"],
        completed=bool(data["completed"]),
        result=data.get("result"),
        deadline=parse_time(data.get("deadline")),
        signal=data.get("signal"),
        meta=data.get("meta"),  # (absent: journaled before StepRecord.meta)
    )


# What a run started by an older version of this driver did (no such keys in its start
# arguments): replaying its history must make the same decisions.
OLD_OUTBOX_RULE = {
    "dead_letter_after": 5,
    "dead_letter_min_seconds": 0.0,
    "outbox_retry_initial_seconds": 0.2,
    "outbox_retry_max_seconds": 5.0,
}
