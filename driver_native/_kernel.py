"""The stateless command kernel: ``kernel.dispatch(command)``.

The kernel holds configuration (database, registry, runner, blob store, sink, clock) and no
run state; it starts no timers. Hosts (the worker, the serverless entry points) drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Coroutine
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from engine_port import (
    Abandoned,
    ClaimCheck,
    Completed,
    EngineSettings,
    EventSink,
    Failed,
    FlushResult,
    GraphModel,
    Outcome,
    Registry,
    SignalResult,
    StageRequest,
    StageRunner,
    VersionInfo,
    Workflow,
    run_prefix,
)
from engine_port.driver import (
    WORKING_RUN_STATUSES,
    AbandonedAttempts,
    Clock,
    check_payload_size,
    delete_prefixes,
    describe_fault,
    fingerprint,
    input_fingerprint,
    is_storage_fault,
    publish_to_sink,
    to_json_value,
    version_key,
)
from engine_port.errors import (
    CommandInProgressError,
    DefinitionVersionConflictError,
    IdempotencyConflictError,
    RunExistsError,
    SpilledPayloadUnavailableError,
    WorkflowNotFoundError,
)

from . import _jobs, _outbox, _progress, _runs
from ._batch import TxBatcher
from ._commands import (
    SKIPPED,
    CancelRun,
    ClaimPending,
    Command,
    CreateRun,
    ExecuteJob,
    FlushOutbox,
    Heartbeat,
    ListVersions,
    PollSuspended,
    PurgeRuns,
    ReapStaleLeases,
    ReapStuckRuns,
    RedriveRun,
    ReleaseJobs,
    ReplayDlq,
    SignalStep,
    Transition,
)
from ._db import Database, commit_was_unknown, commit_with_next
from ._ledger import LeaseTerm, SqlStepLedger, hand_over
from ._schema import command_keys, runs, stages, steps
from ._shape import GraphShape
from ._sql import lock_run, select_where

__all__ = ["Kernel"]

log = logging.getLogger("wfe.kernel")

T = TypeVar("T")


def _token() -> str:
    """A fresh part of a spilled value's key (12 hex digits)."""
    return uuid.uuid4().hex[:12]


def _dag(graph: GraphModel) -> dict[str, tuple[str, ...]]:
    """A definition's stages and what each runs after: what its runs' rows are made of."""
    return {stage.id: tuple(sorted(stage.after)) for stage in graph.stages}


def _dag_difference(old: dict[str, tuple[str, ...]], new: dict[str, tuple[str, ...]]) -> str:
    said = []
    if added := sorted(set(new) - set(old)):
        said.append(f"stages {added} are new")
    if gone := sorted(set(old) - set(new)):
        said.append(f"stages {gone} are gone")
    if moved := sorted(s for s in set(old) & set(new) if old[s] != new[s]):
        said.append(f"stages {moved} run after other stages")
    return ", ".join(said)


class _CompensationAbandoned(Exception):
    """A compensation attempt hit a storage fault: its job is given back like a crashed one."""


def _create_run_once(
    conn: Connection,
    graph: GraphShape,
    run_id: str,
    stored: Any,
    fp: str,
    key: str | None,
    now: float,
    trace_context: str | None = None,
    handoff: _progress.Handoff | None = None,
    define: bool = True,
    max_pending: int | None = None,
    ids: list[int] | None = None,
    chosen: bool = False,
) -> tuple[str, bool]:
    """``_runs.create_run``, made safe to re-run after a commit whose acknowledgement was lost:
    the run this very call inserted (same id, input and creation time) is returned as created
    instead of failing on its duplicate id. ``chosen``: the caller chose ``run_id``; one that
    differs only in case from an existing run's id is refused (RunExistsError)."""
    if commit_was_unknown():
        row = conn.execute(
            sa.select(runs.c.input_fingerprint, runs.c.created_at).where(runs.c.id == run_id)
        ).first()
        if row is not None and row.input_fingerprint == fp and row.created_at == now:
            return run_id, True  # (its handed-off jobs run when their lease expires)
    if chosen:
        twin = _runs.case_twin(conn, run_id)
        if twin is not None:
            raise RunExistsError(run_id, twin)
    return _runs.create_run(
        conn, graph, run_id, stored, fp, key, now, trace_context, handoff, define, ids, max_pending
    )


def _claim_and_begin(
    conn: Connection,
    worker: str,
    served: frozenset[str] | None,
    limit: int,
    lease: float,
    now: float,
    shape_for: Callable[[str], GraphShape],
) -> list[tuple[Any, Any]]:
    """Claim due jobs and begin their stage attempts in the same transaction (one transaction
    per claimed job fewer). Runs are locked in run-id order, so that two claimers sharing
    runs (a fan-out) never wait for each other in a cycle."""
    claimed = _jobs.claim(conn, worker, served, limit, lease, now)
    out: list[tuple[Any, Any]] = [(job, None) for job in claimed if job.kind != "stage"]
    staged = sorted((j for j in claimed if j.kind == "stage"), key=lambda j: (j.run_id, j.id))
    for _, group in itertools.groupby(staged, key=lambda j: j.run_id):
        of_run = list(group)  # a run's jobs begin together: its row is locked once
        begun = _progress.begin_attempts(conn, of_run, worker, now, shape_for(of_run[0].wfv))
        out += [(j, SKIPPED if b is None else b) for j, b in zip(of_run, begun, strict=True)]
    return out


def _apply_and_read(
    conn: Connection,
    job: Any,
    worker: str,
    outcome: Any,
    shape: GraphShape,
    now: float,
    cancelled: bool,
    handoff: _progress.Handoff | None,
    known: Callable[[str, str], GraphModel | None] | None,
    begun: _progress.Begin | None = None,
    ids: list[int] | None = None,
) -> tuple[str, Any]:
    """``_progress.apply_outcome``; with ``known`` (a run someone in this process waits for),
    a transition that finished the run also reads its final state (``_runs.read_run``) in the
    same transaction, and ``wait()`` resolves from it without a read of its own. ``begun``
    and ``ids``: see ``apply_outcome`` (an outcome predicted from its begin)."""
    result = _progress.apply_outcome(
        conn, job, worker, outcome, shape, now, cancelled, handoff, begun, ids
    )
    final = None
    if known is not None and handoff is not None and handoff.finished:
        commit_with_next(conn)  # (the final state is read in the COMMIT's round trip)
        final = _runs.read_run(conn, job.run_id, known)
    return result, final


def _signal_and_begin(
    conn: Connection,
    run_id: str,
    name: str,
    stored: Any,
    now: float,
    idempotency_key: str | None,
    max_pending: int | None,
    known: Callable[[str, str], GraphModel | None],
    handoff: _progress.Handoff | None,
    served: frozenset[str],
    shape_for: Callable[[str], GraphShape],
) -> SignalResult:
    """``_runs.signal_run``; with ``handoff``, the stage the signal wakes is leased to the
    handoff's worker and begun in the same transaction (no trip through the queue), and when
    no earlier signal of the name is queued its wait takes this one here too
    (``_ledger.hand_over``): the resumed stage finds the wait done."""
    if handoff is not None:
        handoff.jobs.clear()  # (a re-run of this transaction hands off only its own)
    claim = None
    postgres = conn.dialect.name == "postgresql"
    if handoff is not None and handoff.limit > 0:
        worker, lease = handoff.worker, handoff.lease

        def claim(run: Any, first: str | None) -> list[_runs.Call] | None:
            take = _jobs.claim_woken(conn, run, f"signal:{name}", served, worker, lease, now)
            if take is None or first is None or not postgres:
                return None if take is None else [take]
            # the begin's reads of the stage the lease should take, in the same round trip
            shape = shape_for(version_key(run.workflow_id, run.version))
            return [take, *_progress.begin_reads(run.id, first, shape)]

    done = _runs.signal_and_claim(
        conn, run_id, name, stored, now, idempotency_key, max_pending, known, claim
    )
    result, job, alone = done.result, done.job, done.alone
    if handoff is not None and job is not None:
        shape = shape_for(job.wfv)
        if done.ahead and done.run is not None and job.stage_id == done.expected:
            begun, _ = _progress.begin_read_ahead(conn, job, done.run, done.ahead, now, shape)
        else:
            begun, _ = _progress.begin_attempt(conn, job, handoff.worker, now, shape)
        if begun is not None:
            if alone:  # the resumed wait takes this signal now, not in a transaction of its own
                gate = shape.stage(begun.stage_id).after_signal == name
                steps = hand_over(
                    conn, job.run_id, begun.stage_id, begun.steps, name, stored, gate=gate
                )
                begun = dataclasses.replace(begun, steps=steps)
            handoff.jobs.append((job, begun))
    return result


def _held(key: str, token: float) -> tuple[Any, ...]:
    return (
        command_keys.c.key == key,
        command_keys.c.status == "in_progress",
        command_keys.c.created_at == token,
    )


def _revive(command: Command, stored: Any) -> Any:
    """A command result stored as JSON under an idempotency key, rebuilt as the type the
    handler returned, so that a repeat returns what the first call returned."""
    if stored is None:
        return None
    if isinstance(command, CreateRun | Heartbeat):
        return tuple(stored)
    if isinstance(command, SignalStep):
        return SignalResult.model_validate(stored)
    if isinstance(command, FlushOutbox):
        return FlushResult.model_validate(stored)
    if isinstance(command, ListVersions):
        return [VersionInfo.model_validate(v) for v in stored]
    return stored


class _Stops:
    """The cancels of the task running a stage attempt made by its heartbeats or its ledger
    (the lease found gone), told apart from anyone else's (the host stopping)."""

    __slots__ = ("made", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.made = 0

    def cancel(self) -> None:
        if self.task.cancel():
            self.made += 1

    def take_back(self) -> None:
        """Ours no longer count in the task's ``cancelling()`` (delivered, or to be ignored)."""
        for _ in range(self.made):
            self.task.uncancel()
        self.made = 0

    async def due(self) -> bool:
        """After an attempt that ended although a cancel of ours was made: whether that
        cancel was still to be delivered (a task cancelled as its coroutine returns ends
        cancelled); False when the attempt caught it and went on. Ours are taken back."""
        try:
            await asyncio.sleep(0)  # (a cancel not delivered yet is delivered here)
        except asyncio.CancelledError:
            return True
        finally:
            self.take_back()
        return False


async def _stoppable(attempt: Coroutine[Any, Any, T], stop: _Stops, beat: _Beat) -> T | None:
    """Await ``attempt`` in the task ``stop`` cancels: its result, or None when a cancel of
    ``stop``'s stopped it (a CancelledError of anyone else's, the host stopping, is raised);
    then no more heartbeats."""
    task = stop.task
    try:
        try:
            result = await attempt
        except asyncio.CancelledError:
            stop.take_back()
            if task.cancelling():
                raise  # the host is shutting down: it releases the lease
            return None
        except BaseException:
            stop.take_back()
            raise
        # (a cancel of ours made as the attempt ended, not delivered yet, stops it all the
        # same, as it stopped the attempt's own task)
        if stop.made and await stop.due():
            if task.cancelling():
                raise asyncio.CancelledError  # (the host's too)
            return None
        return result
    finally:
        await beat.stop()


class _Beat:
    """The heartbeats of a job's lease while ``task`` runs its attempt: one every
    ``heartbeat_interval`` after the previous one ended; a lease found gone (or a stop
    wanted) sets ``cancel`` and cancels ``task``. Between heartbeats a timer waits, not a
    task: most attempts end before the first heartbeat, and a task made, cancelled and
    awaited per attempt cost more CPU than a no-op stage's own work."""

    def __init__(
        self,
        kernel: Kernel,
        job: Any,
        worker: str,
        task: asyncio.Task[Any] | _Stops,
        cancel: asyncio.Event,
        term: LeaseTerm | None = None,
    ) -> None:
        self.kernel, self.job, self.worker, self.task, self.cancel = (
            kernel,
            job,
            worker,
            task,
            cancel,
        )
        self.term = term  # told of each extension of the lease
        self.loop = asyncio.get_running_loop()
        # set once the body has returned: its outcome is recorded as it is (the record checks
        # the lease); the heartbeats go on only to keep the lease while it is stored
        self.settled = False
        self.beating: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self._next()

    def _next(self) -> None:
        self.timer = self.loop.call_later(self.kernel.settings.heartbeat_interval, self._due)

    def _due(self) -> None:
        self.timer = None
        self.beating = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        job, worker = self.job, self.worker
        started = time.monotonic()
        try:
            beat = Heartbeat(job.id, worker, job.lease_token)
            alive, wants_stop = await self.kernel.dispatch(beat)
        except Exception:  # a missed heartbeat is not fatal; the lease has slack
            self._next()
            return
        if alive and self.term is not None:
            self.term.renewed_at = max(self.term.renewed_at, started)
        if wants_stop or not alive:
            if not alive:
                self.kernel._lease_lost(job, worker)
            if self.settled:
                if alive:
                    self._next()
                return
            self.cancel.set()
            self.task.cancel()
            return
        self._next()

    async def stop(self) -> None:
        """No more heartbeats (one in flight is cancelled, and awaited)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        beating = self.beating
        if beating is not None:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating


UNPREDICTABLE_SKIPS = 64
"""Outcomes of a workflow stage recorded the slow way after its guard failed once."""

PURGE_BATCH = 500
"""Runs deleted per purge transaction: short transactions, bounded parameter lists."""


class Kernel:
    def __init__(
        self,
        db: Database,
        registry: Registry,
        settings: EngineSettings,
        claim: ClaimCheck,
        clock: Clock,
        sink: EventSink | None,
    ) -> None:
        self.db = db
        self.registry = registry
        self.settings = settings
        self.claim = claim
        self.clock = clock
        self.sink = sink
        self.runner = StageRunner.for_settings(registry, clock, settings)
        # called with a run id when a transition made in this process completed the run
        # (the engine wakes its ``wait()`` callers without a poll)
        # (with the run's final state, as ``_runs.read_run`` gives it, when ``wants_final``
        # said someone waits for it; else None)
        self.on_run_finished: Callable[[str, Any], None] | None = None
        self.wants_final: Callable[[str], bool] | None = None
        # concurrent creations, and concurrent stage outcomes, share a write transaction
        # while one of their kind is in flight (``_batch``)
        self._creates = TxBatcher(db, _create_run_once)
        # PostgreSQL: job ids reserved ahead for the creations of this kernel (``_runs.create_run``)
        self._job_ids: list[int] | None = [] if db.is_postgres else None
        # "workflow@version"s whose definition a committed start of this kernel saved: later
        # starts do not write it again (a snapshot of the whole graph, ignored on conflict)
        self._defined: set[str] = set()
        # (workflow, version)s whose stages ``check_definitions`` found as stored (or unstored)
        self._checked: set[tuple[str, str]] = set()
        self._outcomes = TxBatcher(db, _apply_and_read)
        # PostgreSQL: "workflow@version stage" -> outcomes of it still recorded the slow way
        # (reads first) after its guard found a prediction wrong (a workflow whose stages
        # emit events, a fan-in): a prediction that keeps failing costs a round trip more
        self._unpredictable: dict[str, int] = {}
        # stage attempts under way in this process (``_execute``): with others, an outcome's
        # record keeps its loop turn, in which theirs queue to share its batch's next
        # transaction (``TxBatcher``: a fan-out's siblings, the stages of many runs)
        self._attempts = 0
        # job id -> (job, worker): attempts abandoned while the database was unreachable,
        # whose lease could not be given back then; a worker gives them back as soon as the
        # database answers again (``return_leases``), so they do not wait for the lease to
        # expire (30 s) after an outage longer than ``database_retry_seconds``
        self._unreturned: dict[int, tuple[Any, str]] = {}
        # attempts abandoned on a storage fault since the last one that went through: one
        # WARNING per outage (the runner counts those it abandons inside an attempt itself)
        self._abandoned = AbandonedAttempts()
        self.flusher_id = f"flush-{uuid.uuid4().hex[:12]}"  # whose outbox claims are whose
        # "workflow@version" -> (its Workflow, its indexed graph): built once, not per stage
        # transition (``Workflow.graph()`` checks the whole definition on every call)
        self._shapes: dict[str, tuple[Workflow[Any], GraphShape]] = {}
        self._handlers: dict[type[Command], Callable[[Any], Awaitable[Any]]] = {
            CreateRun: self._create_run,
            ClaimPending: self._claim,
            ExecuteJob: self._execute,
            Heartbeat: self._heartbeat,
            Transition: self._transition,
            CancelRun: self._cancel,
            RedriveRun: self._redrive,
            PollSuspended: self._poll_suspended,
            SignalStep: self._signal,
            ReapStaleLeases: self._reap_stale,
            FlushOutbox: self._flush,
            ReplayDlq: self._replay_dlq,
            ReapStuckRuns: self._reap_stuck,
            PurgeRuns: self._purge,
            ListVersions: self._list_versions,
            ReleaseJobs: self._release,
        }

    def now(self) -> float:
        return self.clock.now().timestamp()

    async def dispatch(self, command: Command, *, idempotency_key: str | None = None) -> Any:
        """Run one command. With ``idempotency_key``, a repeat returns the first result; a
        repeat while the first is still running raises CommandInProgressError (a key left
        in progress longer than ``command_key_stale_seconds`` is reclaimed)."""
        handler = self._handlers[type(command)]
        if idempotency_key is None:
            return await handler(command)
        fp = fingerprint(to_json_value(repr(command), "command"))
        state, stored = await self.db.tx(
            self._key_begin, idempotency_key, command.name, fp, self.now()
        )
        if state == "done":
            return _revive(command, stored)
        token = stored  # when this call took the key: a stale holder must not touch it later
        try:
            result = await handler(command)
        except BaseException:
            await self.db.tx(self._key_drop, idempotency_key, token)
            raise
        await self.db.tx(
            self._key_done, idempotency_key, to_json_value(result, "command result"), token
        )
        return result

    # -- command idempotency keys --------------------------------------------------------------
    def _key_begin(
        self, conn: Connection, key: str, name: str, fp: str, now: float
    ) -> tuple[str, Any]:
        row = conn.execute(sa.select(command_keys).where(command_keys.c.key == key)).first()
        if row is not None:
            if row.fingerprint != fp or row.command != name:
                raise IdempotencyConflictError(key, row.command)
            if row.status == "done":
                return "done", row.result
            if row.created_at == now and commit_was_unknown():
                # this very call took the key: a re-run of this transaction after its commit's
                # acknowledgement was lost with the connection
                return "new", now
            if now - row.created_at < self.settings.command_key_stale_seconds:
                raise CommandInProgressError(
                    f"command {name} with key {key!r} is still in progress; retry later"
                )
            conn.execute(
                sa.update(command_keys).where(command_keys.c.key == key).values(created_at=now)
            )
            return "reclaimed", now
        conn.execute(
            command_keys.insert().values(
                key=key, command=name, fingerprint=fp, status="in_progress", created_at=now
            )
        )
        return "new", now

    def _key_done(self, conn: Connection, key: str, result: Any, token: float) -> None:
        conn.execute(
            sa.update(command_keys).where(*_held(key, token)).values(status="done", result=result)
        )

    def _key_drop(self, conn: Connection, key: str, token: float) -> None:
        # only while this call still holds the key: a stale holder that fails after another
        # call reclaimed the key must not erase the reclaimer's key (or its stored result)
        conn.execute(sa.delete(command_keys).where(*_held(key, token)))

    # -- helpers ---------------------------------------------------------------------------
    def graph_for(
        self, workflow_id: str, version: str, conn: Connection | None = None
    ) -> GraphModel:
        if self.registry.has(workflow_id, version):
            return self.registry.graph(workflow_id, version)
        if conn is not None:
            g = _runs.load_graph(conn, workflow_id, version)
            if g is not None:
                return g
        raise WorkflowNotFoundError(workflow_id, version)

    def _registry_graph(self, workflow_id: str, version: str) -> GraphModel | None:
        if self.registry.has(workflow_id, version):
            return self.registry.graph(workflow_id, version)
        return None

    def shape_for(self, wfv: str, graph: GraphModel | None = None) -> GraphShape:
        """The indexed graph of a served "workflow@version", kept while the registry holds the
        same Workflow (``graph``: that workflow's graph just built, which replaces a stale
        index of a workflow changed since)."""
        workflow_id, version = wfv.split("@", 1)
        wf = self.registry.get(workflow_id, version)
        hit = self._shapes.get(wfv)
        if hit is None or hit[0] is not wf or (graph is not None and hit[1].graph is not graph):
            hit = (wf, GraphShape(graph if graph is not None else wf.graph()))
            self._shapes[wfv] = hit
        return hit[1]

    def served(self) -> frozenset[str]:
        return frozenset(version_key(w, v) for w, v in self.registry.served())

    async def check_definitions(self, keys: Collection[tuple[str, str]] | None = None) -> None:
        """Raise DefinitionVersionConflictError when a (workflow, version) this registry
        serves has other stages (ids or dependencies) than the definition the database holds
        for its runs: a structure changed without a new ``version=``. A worker serving it took
        the runs started with the old one and failed in the engine on every claim, for good
        (a stage of the new code had no row in them), re-running the stage before it each
        time. ``keys``: only these (workflow, version)s (a start checks its own)."""
        todo = sorted(set(self.registry.served() if keys is None else keys) - self._checked)
        if not todo:
            return
        stored = await self.db.read(lambda c: _runs.load_graphs(c, todo))
        for (workflow_id, version), old in sorted(stored.items()):
            new = self.registry.graph(workflow_id, version)
            if _dag(old) != _dag(new):
                raise DefinitionVersionConflictError(
                    workflow_id, version, stored=_dag_difference(_dag(old), _dag(new))
                )
        self._checked.update(todo)

    def serves(self, wfv: str) -> bool:
        """``wfv in self.served()`` without making that set of every registered version (per
        start, it grew with the registry). A workflow id holds no ``@``."""
        workflow_id, at, version = wfv.partition("@")
        return bool(at) and self.registry.has(workflow_id, version)

    # -- run commands ----------------------------------------------------------------------
    async def _create_run(self, cmd: CreateRun) -> tuple[str, bool]:
        wf = self.registry.get(cmd.workflow_id, cmd.version)
        graph = wf.graph()
        wfv = version_key(wf.id, graph.version)
        if wfv not in self._defined:  # (a run of a changed structure is not started)
            await self.check_definitions([(wf.id, graph.version)])
        shape = self.shape_for(wfv, graph)
        value = cmd.input
        if not cmd.validated:
            value = wf.validate_input(value).model_dump(mode="json")
        check_payload_size(value, f"input of workflow {wf.id!r}", self.settings.max_payload_bytes)
        fp = input_fingerprint(wf.id, value)
        run_id = cmd.run_id or uuid.uuid4().hex
        # a key of its own: a CreateRun naming an existing run id must not overwrite its input
        stored = await self.claim.dump(value, lambda: f"runs/{run_id}/input-{_token()}")
        try:
            for attempt in range(3):
                now = self.now()
                args = (
                    shape,
                    run_id,
                    stored,
                    fp,
                    cmd.idempotency_key,
                    now,
                    cmd.trace_context,
                    cmd.handoff,
                    wfv not in self._defined,
                    self.settings.max_pending_signals,
                )
                try:
                    result = await self._create_unread_first(args, cmd.run_id is not None)
                except IntegrityError:
                    if cmd.run_id is not None and await self._run_exists(cmd.run_id):
                        raise RunExistsError(cmd.run_id) from None
                    if cmd.idempotency_key is None or attempt == 2:
                        raise  # a concurrent duplicate won the race: read it on the next try
                else:
                    if result[1]:
                        self._defined.add(wfv)  # (committed with the run)
                    if not result[1] and result[0] == run_id and cmd.run_id is None:
                        return run_id, True  # (a re-run found the run our lost commit made)
                    if not result[1]:
                        await self._drop_orphan_input(run_id, stored)
                    return result
        except BaseException:
            await self._drop_orphan_input(run_id, stored)
            raise
        raise AssertionError("unreachable")

    async def _create_unread_first(
        self, args: tuple[Any, ...], chosen: bool = False
    ) -> tuple[str, bool]:
        """``_create_run_once``, with the job ids this kernel reserved ahead (PostgreSQL: no
        read round trip before the writes), then, if its drain check refused it, without
        them (the read then says whether and to what the workflow is drained)."""
        ids = self._job_ids
        try:
            return await self._creates.run(*args, ids, chosen)
        except DBAPIError as exc:
            if ids is None or not _runs.refused_unread(exc):
                raise
        return await self._creates.run(*args, None, chosen)

    def _lease_term(self, job: Any, worker: str) -> LeaseTerm:
        """The term of ``worker``'s lease of ``job``, renewed by a heartbeat when it may have
        lapsed (``LeaseTerm.check``)."""

        async def renew() -> bool:
            alive, _ = await self.dispatch(Heartbeat(job.id, worker, job.lease_token))
            return bool(alive)

        return LeaseTerm(self.settings.lease_threshold, renew)

    async def _run_exists(self, run_id: str) -> bool:
        row = await self.db.read(
            lambda c: c.execute(sa.select(runs.c.id).where(runs.c.id == run_id)).first()
        )
        return row is not None

    async def _drop_orphan_input(self, run_id: str, stored: Any) -> None:
        """A spilled input whose run was not created (an idempotent repeat, a conflict) must
        not stay behind in the blob store: bad input writes nothing."""
        key = self.claim.key_of(stored)
        if key is None:
            return
        current = await self.db.read(
            lambda c: c.execute(sa.select(runs.c.input).where(runs.c.id == run_id)).first()
        )
        if current is None or self.claim.key_of(current.input) != key:
            await self.claim.store.delete(key)

    async def _signal(self, cmd: SignalStep) -> SignalResult:
        payload = to_json_value(cmd.payload, f"payload of signal {cmd.signal!r}")
        limit = self.settings.max_payload_bytes
        check_payload_size(payload, f"payload of signal {cmd.signal!r}", limit)
        stored = await self.claim.dump(
            payload, f"{run_prefix(cmd.run_id)}signals/{uuid.uuid4().hex[:16]}"
        )
        key = self.claim.key_of(stored)
        try:
            result = await self.db.tx(
                _signal_and_begin,
                cmd.run_id,
                cmd.signal,
                stored,
                self.now(),
                cmd.idempotency_key,
                self.settings.max_pending_signals,
                self._registry_graph,
                cmd.handoff,
                cmd.served,
                self.shape_for,
            )
        except BaseException:
            if key is not None:
                await self.claim.store.delete(key)
            raise
        if key is not None and result.already_completed:
            await self.claim.store.delete(key)
        return result

    async def _cancel(self, cmd: CancelRun) -> bool:
        return await self.db.tx(_runs.cancel_run, cmd.run_id, self.now())

    async def _redrive(self, cmd: RedriveRun) -> None:
        def run(conn: Connection) -> None:
            run_row = lock_run(conn, cmd.run_id)  # (RunNotFoundError)
            if cmd.version == "latest":
                graph = self.registry.graph(run_row.workflow_id)
            elif cmd.version is not None:
                graph = self.registry.graph(run_row.workflow_id, cmd.version)
            else:
                graph = self.graph_for(run_row.workflow_id, run_row.version, conn)
            if cmd.version is not None and (
                run_row.status in WORKING_RUN_STATUSES or run_row.frozen
            ):
                # a stranded run that has not ended: re-pinned, nothing re-run
                run_graph = self.graph_for(run_row.workflow_id, run_row.version, conn)
                _runs.repin_run(conn, run_row, cmd.from_, run_graph, graph, self.now())
                return
            _runs.redrive_run(conn, cmd.run_id, cmd.from_, graph, self.now())

        await self.db.tx(run)

    async def _list_versions(self, _cmd: ListVersions) -> list[VersionInfo]:
        latest = {w: self.registry.latest_version(w) for w in self.registry.workflow_ids()}
        return await self.db.tx(_runs.list_versions, self.registry.served(), latest)

    async def _purge(self, cmd: PurgeRuns) -> int:
        """Delete finished runs in batches (one short transaction each), then each batch's
        own blob prefix: linear in the runs purged, never a walk of the whole store."""
        cutoff, n = self.now() - cmd.older_than_seconds, 0
        if not await self.db.read(_runs.any_purgeable, cutoff):
            return 0  # (a worker with retention asks every second: no write lock for nothing)
        while True:
            ids = await self.db.tx(_runs.purge_runs, cutoff, PURGE_BATCH)
            await delete_prefixes(self.claim.store, [f"runs/{rid}/" for rid in ids])
            n += len(ids)
            if len(ids) < PURGE_BATCH:
                return n

    async def _reap_stuck(self, cmd: ReapStuckRuns) -> int:
        def graphs(conn: Connection, run: Any) -> GraphModel | None:
            try:
                return self.graph_for(run.workflow_id, run.version, conn)
            except WorkflowNotFoundError:
                return None

        if not await self.db.read_long(_runs.any_stuck, self.now(), cmd.grace_seconds):
            return 0  # (the common case: no write transaction, on SQLite no write lock)
        return await self.db.tx(_runs.reap_stuck, self.now(), cmd.grace_seconds, graphs)

    # -- jobs ------------------------------------------------------------------------------
    async def _claim(self, cmd: ClaimPending) -> list[Any]:
        served: frozenset[str] | None = cmd.served if cmd.served is not None else self.served()
        if cmd.served is None and self.settings.serves == "all":
            served = None  # the serves="all" setting: no version filter
        if cmd.probe or not self.db.is_postgres:
            now = self.now()
            at = await self.db.read(_jobs.next_due, served)
            due = at is not None and at <= now
            if cmd.on_next_due is not None:
                cmd.on_next_due(at, due)  # (when to look again: no statement of its own)
            if not due:
                return []  # idle: no write transaction (on SQLite no write lock) for nothing
        if cmd.begin:
            return await self.db.tx(
                _claim_and_begin,
                cmd.worker_id,
                served,
                cmd.limit,
                self.settings.lease_threshold,
                self.now(),
                self.shape_for,
            )
        return await self.db.tx(
            _jobs.claim, cmd.worker_id, served, cmd.limit, self.settings.lease_threshold, self.now()
        )

    async def _heartbeat(self, cmd: Heartbeat) -> tuple[bool, bool]:
        lease, now = self.settings.lease_threshold, self.now()
        return await self.db.tx(
            _jobs.heartbeat, cmd.job_id, cmd.worker_id, lease, now, cmd.lease_token
        )

    async def _release(self, cmd: ReleaseJobs) -> int:
        return await self.db.tx(_jobs.release, cmd.job_ids, cmd.worker_id, cmd.lease_tokens)

    async def _reap_stale(self, _cmd: ReapStaleLeases) -> int:
        reaped = await self.db.tx(_jobs.reap_stale, self.now())
        for job in reaped:
            # the worker named here may still be alive (hung, or starved of CPU so long that
            # no heartbeat got through): the step it ran but had not journaled runs again
            # (DESIGN §5, crash semantics); it finds its lease lost at its next heartbeat, its
            # next step journaled or signal taken (written only under the lease: _ledger) or
            # when it records its outcome, and stops
            log.warning(
                "job %s of run %s (%s %s): lease of worker %s expired %.1fs ago; released: "
                "the next worker serving %s to claim it runs the attempt again, replaying its "
                "journaled steps",
                job.id,
                job.run_id,
                job.kind,
                job.stage_id,
                job.lease_owner,
                max(0.0, float(job.overdue or 0.0)),
                job.wfv,
                extra={
                    "wfe_run_id": job.run_id,
                    "wfe_stage": job.stage_id,
                    "wfe_lease_owner": job.lease_owner,
                },
            )
        return len(reaped)

    async def _poll_suspended(self, _cmd: PollSuspended) -> int:
        return await self.db.tx(_jobs.poll_suspended, self.now())

    async def _transition(self, cmd: Transition, handoff: _progress.Handoff | None = None) -> str:
        result, _final = await self._record(cmd, handoff, False)
        return result

    async def _spill(self, job: Any, outcome: Any) -> tuple[Any, str | None]:
        """The outcome as it is recorded (a completed one's output through the claim check)
        and the blob key of its spilled output (None: inline, or not completed)."""
        if not isinstance(outcome, Completed):
            return outcome, None
        # small outputs stay inline in the stage row (DESIGN §5); a spilled one gets a key
        # of its own per outcome: a late, discarded outcome must never overwrite the
        # output that another worker's completed attempt stored
        prefix = f"runs/{job.run_id}/stages/{job.stage_id}/output-"
        stored = await self.claim.dump(outcome.output, lambda: prefix + _token())
        return Completed(stored, outcome.events), self.claim.key_of(stored)

    async def _record(
        self,
        cmd: Transition,
        handoff: _progress.Handoff | None,
        read_final: bool,
        spilled: tuple[Any, str | None] | None = None,
        begun: _progress.Begin | None = None,
        turn: bool = True,
    ) -> tuple[str, Any]:
        """Record a transition; with ``read_final``, a transition that finishes the run
        returns its final state too (else None). ``spilled``: what :meth:`_spill` made of
        the outcome already (under the attempt's heartbeats). ``begun``: the attempt's begin
        (PostgreSQL: the outcome is predicted from it, see ``_progress.apply_outcome``).
        ``turn=False``: the caller ends its task right after (``TxBatcher.run``)."""
        job = cmd.job
        shape = self.shape_for(job.wfv)
        outcome, key = spilled if spilled is not None else await self._spill(job, cmd.outcome)
        args = (job, cmd.worker_id, outcome, shape, self.now(), cmd.cancelled, handoff)
        known = self._registry_graph if read_final else None
        if begun is not None and self._job_ids is not None:
            where = f"{job.wfv} {job.stage_id}"
            skip = self._unpredictable.get(where)
            if skip:
                begun = None
                if skip > 1:
                    self._unpredictable[where] = skip - 1
                else:
                    del self._unpredictable[where]
            try:
                result, final = await self._outcomes.run(
                    *args, known, begun, self._job_ids, turn=turn
                )
            except DBAPIError as exc:
                if not _progress.guard_failed(exc):
                    raise
                # the run moved since the attempt began (cancelled, the lease taken over, a
                # sibling's outcome, staged events): nothing was written; read, then write
                self._unpredictable[where] = UNPREDICTABLE_SKIPS
                if handoff is not None:
                    handoff.quiet = handoff.finished = False
                result, final = await self._outcomes.run(
                    *args, known, None, self._job_ids, turn=turn
                )
        else:
            result, final = await self._outcomes.run(*args, known, None, self._job_ids, turn=turn)
        if key is not None and result != "completed" and not await self._stored_output(job, key):
            # (a re-run of the transaction after a lost acknowledgement reports "discarded"
            # although its first try committed this very output: that blob stays)
            await self.claim.store.delete(key)
        return result, final

    def _run_finished(self, run_id: str, final: Any = None) -> None:
        if self.on_run_finished is not None:
            self.on_run_finished(run_id, final)

    async def _stored_output(self, job: Any, key: str) -> bool:
        def q(conn: Connection) -> Any:
            return conn.execute(
                sa.select(stages.c.output).where(
                    stages.c.run_id == job.run_id, stages.c.stage_id == job.stage_id
                )
            ).scalar()

        return self.claim.key_of(await self.db.read(q)) == key

    async def _execute(self, cmd: ExecuteJob) -> str:
        """Run one job. A fault of the engine's storage (DESIGN §5) while the attempt starts,
        runs or is recorded abandons it as a crash would, except that the lease is given back
        at once: the job is due again after a backoff, with its attempt number kept."""
        try:
            if cmd.job.kind == "compensate":
                result = await self._compensate(cmd)
            else:
                self._attempts += 1
                try:
                    result = await self._execute_stage(cmd)
                finally:
                    self._attempts -= 1
        except Exception as exc:
            if not (isinstance(exc, _CompensationAbandoned) or is_storage_fault(exc)):
                raise
            due = await self._abandon(cmd.job, cmd.worker_id, exc)
            if due is not None and cmd.on_due is not None:
                cmd.on_due(due)
            return "abandoned"
        if result != "abandoned":
            # (a job abandoned in the outage went through, or none was for a while: a job
            # that needs nothing of the failing store proves nothing about it)
            self._abandoned.report(log.log, int(cmd.job.id))
        return result

    async def _abandon(self, job: Any, worker: str, exc: BaseException) -> float | None:
        """Give the job back, due again after a backoff: when (None: its lease could not be
        given back now)."""
        # one WARNING per outage (an S3 or disk fault lets jobs be claimed and abandoned
        # again every few seconds each, for as long as it lasts); the rest at DEBUG
        level, note = self._abandoned.abandoned(int(job.id))
        log.log(
            level,
            "job %s of run %s: the engine's storage failed (%s); the attempt is abandoned and "
            "runs again in %gs without using up a retry%s",
            job.id,
            job.run_id,
            describe_fault(exc),
            _progress.ABANDON_BACKOFF_S,
            note,
        )
        due = self.now() + _progress.ABANDON_BACKOFF_S
        try:
            await self.db.tx(_progress.abandon_job, job, worker, due)
        except Exception as again:
            if not is_storage_fault(again):
                raise
            self._unreturned[int(job.id)] = (job, worker)
            log.warning(
                "job %s of run %s: could not give its lease back (%s); a worker gives it back "
                "when the database answers again (else it is taken over when the lease expires)",
                job.id,
                job.run_id,
                describe_fault(again),
            )
            return None
        return due

    async def return_leases(self) -> int:
        """Give back the leases of attempts abandoned while the database was unreachable (see
        ``_abandon``): their jobs are due at once. Returns how many were given back; stops at
        the first storage fault (the database is still away: the next call tries again)."""
        returned = 0
        for key, (job, worker) in list(self._unreturned.items()):
            try:
                returned += await self.db.tx(_progress.abandon_job, job, worker, self.now())
            except Exception as exc:
                if not is_storage_fault(exc):
                    self._unreturned.pop(key, None)
                    raise
                break
            self._unreturned.pop(key, None)
        return returned

    async def _execute_stage(self, cmd: ExecuteJob) -> str:
        job, worker = cmd.job, cmd.worker_id
        begin = cmd.begun
        if begin is None:
            begin, _ = await self.db.tx(
                _progress.begin_attempt, job, worker, self.now(), self.shape_for(job.wfv)
            )
        if begin is None:
            return "skipped"
        wf = self.registry.get(begin.workflow_id, begin.version)
        cancel = asyncio.Event()

        def lost() -> None:  # a ledger write found the lease gone: stop as _beat would
            self._lease_lost(job, worker)
            cancel.set()
            stop.cancel()

        term = self._lease_term(job, worker)
        ledger = SqlStepLedger(
            self.db,
            self.claim,
            begin.run_id,
            begin.stage_id,
            begin.steps,
            lease=_jobs.Lease.of(job, worker),
            on_lost=lost,
            term=term,
        )

        async def attempt() -> tuple[Any, tuple[Any, str | None]]:
            # the blob reads of the attempt's input and outputs and the write of its output
            # are part of it, under its heartbeats: a slow blob store (a large value, a
            # struggling S3) must not let the lease lapse while this worker is still at it,
            # or another claim runs the stage body a second time beside this one
            missing: SpilledPayloadUnavailableError | None = None
            try:
                value = await self.claim.load(begin.input, run_id=begin.run_id)
                outputs = {
                    k: await self.claim.load(v, run_id=begin.run_id)
                    for k, v in begin.outputs.items()
                }
            except SpilledPayloadUnavailableError as exc:
                value, outputs, missing = None, {}, exc
            # (made once, with the values loaded: a frozen dataclass's replace() cost more
            # than the request itself)
            request = StageRequest(
                run_id=begin.run_id,
                workflow=wf,
                stage_id=begin.stage_id,
                attempt=begin.attempt,
                input=value,
                outputs=outputs,
                cancel_event=cancel,
                resumed=bool(begin.steps) and not begin.fresh,  # a retry is no resumption
                trace_context=begin.trace_context,
                version=begin.version,
            )
            if missing is not None:
                outcome: Outcome = self.runner.values_missing(request, missing)
            else:
                outcome = await self.runner.run(request, ledger)
            beat.settled = True
            return outcome, await self._spill(job, outcome)

        # the attempt runs in this task (a task of its own cost two turns of the event loop
        # per stage: its start, and this task's wake-up at its end); the heartbeats and the
        # ledger cancel this task when the lease is found gone (``_Stops``)
        current = asyncio.current_task()
        assert current is not None
        stop = _Stops(current)
        beat = _Beat(self, job, worker, stop, cancel, term)
        ran = await _stoppable(attempt(), stop, beat)
        if ran is None:
            return await self._transition(Transition(job, worker, None, cancelled=True))
        outcome, spilled = ran
        limit = cmd.handoff if cmd.on_handoff is not None else 0
        handoff = _progress.Handoff(worker, self.settings.lease_threshold, limit)
        waited = self.wants_final is not None and self.wants_final(job.run_id)
        transition = Transition(job, worker, outcome)
        # (alone, the record needs no loop turn of its own: the job's task ends right after)
        alone = self._attempts <= 1
        result, final = await self._record(
            transition, handoff, waited, spilled, begin, turn=not alone
        )
        if handoff.finished:
            self._run_finished(job.run_id, final)
        if (handoff.jobs or handoff.quiet) and cmd.on_handoff is not None:
            cmd.on_handoff(handoff.jobs)  # (an empty list: nothing was left for the queue)
        if handoff.due_at is not None and cmd.on_due is not None:
            cmd.on_due(handoff.due_at)
        return result

    def _lease_lost(self, job: Any, worker: str) -> None:
        log.warning(
            "job %s of run %s (%s %s): worker %s no longer holds its lease (no "
            "heartbeat got through in time and another claim took the job over, of "
            "another worker or of this one again, or the job is gone); the attempt is stopped",
            job.id,
            job.run_id,
            job.kind,
            job.stage_id,
            worker,
            extra={"wfe_run_id": job.run_id, "wfe_stage": job.stage_id},
        )

    async def _compensate(self, cmd: ExecuteJob) -> str:
        """Run a compensation job. It stops, as a stage attempt does, when its lease is found
        gone (by a heartbeat, a step journaled or a compensation recorded): ``discarded``,
        the job is another claim's now, which compensates from where the journal is."""
        job, worker = cmd.job, cmd.worker_id
        wf_id, version = job.wfv.split("@", 1)
        wf = self.registry.get(wf_id, version)
        now = self.now()
        plan = await self.db.tx(_progress.begin_compensation_job, job, worker, wf.graph(), now)
        if plan is None:
            if cmd.on_due is not None:  # (also when the lease was found gone: a look for nothing)
                cmd.on_due(now + _progress.COMPENSATION_RECHECK_S)
            return "deferred"
        cancel = asyncio.Event()  # set once the lease is found gone (ctx.cancelled)

        def on_lost() -> None:  # a ledger write or a record found the lease gone
            self._lease_lost(job, worker)
            cancel.set()

        # (as for a stage attempt: a worker paused past its lease renews it before running a
        # step body, and stops if the job is another claim's now; the heartbeats extend it)
        term = self._lease_term(job, worker)
        work = asyncio.create_task(
            self._compensate_plan(wf, plan, job, worker, cancel, on_lost, term)
        )
        beat = _Beat(self, job, worker, work, cancel, term)
        try:
            await work
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not cancel.is_set() or (current is not None and current.cancelling()):
                raise  # (the host is shutting down: it releases the lease)
            return "discarded"
        finally:
            await beat.stop()
        self._run_finished(plan.run_id)
        return "compensated"

    async def _compensate_plan(
        self,
        wf: Any,
        plan: _progress.CompensationPlan,
        job: Any,
        worker: str,
        cancel: asyncio.Event,
        on_lost: Callable[[], None],
        term: LeaseTerm | None = None,
    ) -> None:
        """The compensations of ``plan``, newest first, then the run's end; each write made
        under ``job``'s claim by ``worker`` (``on_lost`` and CancelledError when it is gone);
        ``term``: the lease's, checked before a step body runs."""
        run_input: Any = None
        outputs: dict[str, Any] = {}
        missing: SpilledPayloadUnavailableError | None = None
        if plan.todo:
            try:
                run_input = await self.claim.load(plan.input, run_id=plan.run_id)
                outputs = {
                    k: await self.claim.load(v, run_id=plan.run_id) for k, v in plan.outputs.items()
                }
            except SpilledPayloadUnavailableError as exc:
                missing = exc  # (each compensation fails with it: see values_missing)
        for stage_id, stored in plan.todo:
            output = None
            lacking = missing
            if lacking is None:
                try:
                    output = await self.claim.load(stored, run_id=plan.run_id)
                except SpilledPayloadUnavailableError as exc:
                    lacking = exc
            await self._compensate_stage(
                wf,
                plan.run_id,
                stage_id,
                run_input,
                outputs,
                output,
                plan.trace_context,
                lease=(job, worker, cancel, on_lost),
                missing=lacking,
                term=term,
            )
        if not await self.db.tx(_progress.finish_compensation, job, worker, self.now()):
            self._compensation_lost(job, worker, on_lost)

    def _compensation_lost(self, job: Any, worker: str, on_lost: Callable[[], None]) -> None:
        on_lost()
        raise asyncio.CancelledError(f"job {job.id}: the lease of {worker} is gone")

    async def _compensate_stage(
        self,
        wf: Any,
        run_id: str,
        stage_id: str,
        run_input: Any,
        outputs: dict[str, Any],
        output: Any,
        trace_context: str | None,
        *,
        lease: tuple[Any, str, asyncio.Event, Callable[[], None]],
        missing: SpilledPayloadUnavailableError | None = None,
        term: LeaseTerm | None = None,
    ) -> None:
        """``lease``: the compensation job (as claimed), the worker holding its lease, the
        event set when the lease is found gone, and what to call when a write finds it gone
        (every write checks the claim; one that finds it gone raises CancelledError).
        ``missing``: a value the compensation needs is not in the blob store: it fails."""
        stage = wf.get_stage(stage_id)
        job, worker, cancel, on_lost = lease
        ledger_id = f"{stage_id}#compensation"
        attempt = 1
        while True:
            rows = await self.db.read(
                lambda c: list(select_where(c, steps, run_id=run_id, stage_id=ledger_id).all())
            )
            ledger = SqlStepLedger(
                self.db,
                self.claim,
                run_id,
                ledger_id,
                rows,
                lease=_jobs.Lease.of(job, worker),
                on_lost=on_lost,
                term=term,
            )
            req = StageRequest(
                run_id,
                wf,
                stage_id,
                attempt,
                run_input,
                outputs,
                cancel_event=cancel,
                trace_context=trace_context,
            )
            if missing is not None:
                outcome: Outcome = self.runner.values_missing(req, missing, compensation=True)
            else:
                outcome = await self.runner.compensate(req, output, ledger)
            if isinstance(outcome, Abandoned):
                raise _CompensationAbandoned(outcome.reason)
            error = None
            if isinstance(outcome, Failed):
                if outcome.retryable and attempt < stage.retry.max_attempts:
                    await self.clock.sleep(stage.retry.delay_after(attempt).total_seconds())
                    attempt += 1
                    continue
                error = outcome.error
            else:
                assert isinstance(outcome, Completed)
            record = _progress.record_compensation
            if not await self.db.tx(record, job, worker, stage_id, error, self.now()):
                self._compensation_lost(job, worker, on_lost)
            return

    # -- outbox ----------------------------------------------------------------------------
    async def _flush(self, cmd: FlushOutbox) -> FlushResult:
        if self.sink is None:
            return FlushResult()  # no sink here: events wait in the outbox for a host with one
        now = self.now()
        pending, waiting = await self.db.tx_long(
            _outbox.pending_events,
            cmd.limit,
            None if cmd.force else now,
            self.flusher_id,
            now,
            self.settings.lease_seconds,
        )
        if not pending:
            return FlushResult(sink_status="degraded" if waiting else "healthy")
        by_run: dict[str, list[_outbox.Pending]] = {}
        for item in pending:
            by_run.setdefault(item.event.run_id, []).append(item)
        delivered: list[int] = []
        failed: list[tuple[list[_outbox.Pending], str]] = []
        # the claims last lease_seconds: a flush that publishes longer (a slow sink, many
        # runs, a publish that hangs up to its timeout) renews them as a job's heartbeats
        # renew its lease, until its outcome is written. Without it the claims lapsed
        # mid-flush and another live worker published the same events again (every event
        # twice, under a sink taking 0.1 s a run, with lease_seconds=1)
        lost: set[int] = set()
        keeper = asyncio.create_task(self._keep_flush_claims([p.row_id for p in pending], lost))
        try:
            for items in by_run.values():
                if any(p.row_id in lost for p in items):
                    continue  # its claim lapsed and another flush took it: it publishes them
                # the sink is the user's: whatever it raises, or a call that hangs, is a
                # failed delivery (bounded, retried with backoff); it never blocks runs
                error = await publish_to_sink(self.sink, [p.event for p in items])
                if error is None:
                    delivered += [p.row_id for p in items]
                else:
                    failed.append((items, error))
            rule = _outbox.RetryRule.from_settings(self.settings)
            dead = await self.db.tx(_outbox.mark_flushed, delivered, failed, rule, self.now())
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        _outbox.log_dead(dead, rule)
        n_failed = sum(len(items) for items, _ in failed)
        return FlushResult(  # a dead letter is not retried: not counted in ``failed`` too
            published=len(delivered),
            failed=n_failed - len(dead),
            dead_lettered=len(dead),
            sink_status="degraded" if failed or waiting else "healthy",
            sink_error=failed[0][1] if failed else None,
        )

    async def _keep_flush_claims(self, row_ids: list[int], lost: set[int]) -> None:
        """Renew this flusher's claims of ``row_ids`` every third of ``lease_seconds`` (the
        rows whose claim lapsed, or another flush took, go to ``lost``: not published here).
        A renewal that fails is tried again at the next one: the claim has the slack of two."""
        lease = self.settings.lease_seconds
        while True:
            await asyncio.sleep(lease / 3)
            try:
                now = self.now()
                kept = await self.db.tx(
                    _outbox.renew_claims, row_ids, self.flusher_id, now, now + lease
                )
            except Exception:  # (a storage fault: the next renewal tries again)
                log.debug("renewing the outbox claims of a flush failed", exc_info=True)
                continue
            lost.update(set(row_ids) - kept)

    async def _replay_dlq(self, _cmd: ReplayDlq) -> int:
        return await self.db.tx(_outbox.replay_dead)
