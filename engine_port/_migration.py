"""Moving live runs between engines (drivers) at safe points, with nothing run twice and
nothing lost. Driver-agnostic: it uses only the port's export/import calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel, Field

from ._blobs import INLINE_MARKER, BlobStore, ClaimCheck, run_prefix
from ._engine import WorkflowEngine
from ._limits import (
    check_list_call,
    check_run_call,
    check_version,
    check_wait_seconds,
    check_workflow_ids,
)
from ._models import ACTIVE_RUN_STATUSES, RunInfo, RunSnapshot, RunStatus
from .errors import (
    EngineError,
    InvalidInputError,
    MigrationError,
    RunNotActiveError,
    RunNotFoundError,
    SpilledPayloadUnavailableError,
)

__all__ = [
    "MigrationReport",
    "RunMove",
    "abort_migration",
    "check_import_blobs",
    "frozen_run_error",
    "keyed_repeat",
    "migrate_run",
    "migrate_runs",
]


def keyed_repeat(info: RunInfo) -> RunInfo:
    """A driver's answer to a start whose idempotency key names run ``info`` already there:
    the run, unless it moved to another engine. Then RunNotActiveError (status ``migrated``,
    ``migrated_to`` naming where it went), as for a signal or cancel of it there: answering
    with the ``migrated`` record gave the caller a run it could neither wait on nor signal.
    The key still never starts a second run (the driver checked the input first: another
    input is IdempotencyConflictError); the caller starts it again through the engine it
    moved to, or a routing engine over both, which answers with the live run."""
    if info.status == RunStatus.MIGRATED:
        raise RunNotActiveError(info.id, info.status, "start", migrated_to=info.migrated_to)
    return info


def frozen_run_error(run_id: str, action: str, driver: str) -> MigrationError:
    """A driver's answer to a signal or cancel of a run frozen for a move (``action``: "signal
    'go'", "cancel"). "Retry in a moment" alone sent a caller round for good when the
    migration that froze the run was killed: nothing unfreezes such a run but a rerun of the
    migration, which finishes the move, or its abort."""
    return MigrationError(
        f"run {run_id!r} is being moved to another driver (frozen); retry the {action} in a "
        "moment (it then reaches the run wherever it lives). If no migration is under way "
        f"(one was interrupted), `wfe migrate --from {driver} --to TARGET --run {run_id}` "
        "finishes the move (migrate_run() in code), and the same command with --abort keeps "
        f"the run on {driver} (abort_migration() in code)"
    )


class RunMove(BaseModel):
    run_id: str
    workflow_id: str
    outcome: Literal["moved", "would_move", "skipped", "left", "unfrozen"]
    reason: str | None = None


class MigrationReport(BaseModel):
    source: str
    target: str
    dry_run: bool = False
    moves: list[RunMove] = Field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(m.outcome == outcome for m in self.moves)


def _spill_keys(value: Any, prefix: str | None, out: set[str]) -> None:
    """The blob keys of the references in a snapshot: boxed user values are not looked into,
    and only keys under the run's own ``prefix`` count (None: every key)."""
    if isinstance(value, dict):
        if INLINE_MARKER in value and len(value) == 1:
            return
        key = ClaimCheck.key_of(value)
        if key is not None:
            if prefix is None or key.startswith(prefix):
                out.add(key)
            return
        for v in value.values():
            _spill_keys(v, prefix, out)
    elif isinstance(value, list):
        for v in value:
            _spill_keys(v, prefix, out)


async def check_import_blobs(snapshot: RunSnapshot, store: BlobStore) -> None:
    """Before an import writes anything: every spilled value ``snapshot`` refers to lies
    under its run's own prefix and is in ``store`` (the importing engine's), else
    SpilledPayloadUnavailableError naming the first one that is not. An import wrote the run
    and only then failed to read such a value: the run stayed behind, and reading it failed
    (a snapshot whose run id was edited: its references lie under the old id's prefix; a
    move whose blobs were not copied to the target's store)."""
    keys: set[str] = set()
    _spill_keys(snapshot.model_dump(mode="json"), None, keys)
    prefix = run_prefix(snapshot.run_id)
    for key in sorted(keys):
        if not key.startswith(prefix):
            raise SpilledPayloadUnavailableError(
                key,
                f"it lies outside run {snapshot.run_id!r}'s own prefix {prefix!r} (was the "
                "snapshot's run id edited?); import the snapshot export_run() gave, unedited",
            )
    for key in sorted(keys):
        if not await store.has(key):
            raise SpilledPayloadUnavailableError(key)


async def copy_blobs(snapshot: RunSnapshot, source: BlobStore, target: BlobStore) -> int:
    """Copy every blob the snapshot references from ``source`` to ``target``."""
    keys: set[str] = set()
    _spill_keys(snapshot.model_dump(mode="json"), run_prefix(snapshot.run_id), keys)
    for key in sorted(keys):
        if not await target.has(key):
            await target.put(key, await source.get(key))
    return len(keys)


def _blob_stores(
    source: WorkflowEngine, target: WorkflowEngine
) -> tuple[BlobStore, BlobStore] | None:
    """The engines' own blob stores when ``blobs`` was not given: the target of a move read
    a spilled value from its own store, which (another blob_url, or PostgreSQL's ``db://``
    default) did not have it, and the run failed there."""
    stores = source.spill_store, target.spill_store
    if stores[0] is None or stores[1] is None or stores[0] is stores[1]:
        return None
    return stores[0], stores[1]


async def _holds(target: WorkflowEngine, run_id: str, *, strict: bool = False) -> bool:
    """Whether ``target`` has an active run ``run_id`` (read without any value or blob);
    False when that cannot be told, unless ``strict`` (then the error is raised)."""
    try:
        found = await target.list_runs(id_prefix=run_id, limit=2, outputs=False)
    except Exception:
        if strict:
            raise
        return False
    return any(r.id == run_id and r.status in ACTIVE_RUN_STATUSES for r in found)


def _check_two_engines(source: WorkflowEngine, target: WorkflowEngine) -> None:
    """One engine as source and target marked each run migrated to where it already was
    (the import found it there, "already moved"), and nothing ran it again."""
    if source is target:
        raise MigrationError(
            "the source and the target are the same engine; pass an engine on another "
            "driver (or another database) as the target"
        )


async def migrate_run(
    source: WorkflowEngine,
    target: WorkflowEngine,
    run_id: str,
    *,
    wait: float = 30.0,
    blobs: tuple[BlobStore, BlobStore] | None = None,
) -> RunMove:
    """Move one run: freeze and export it at a safe point, import it into ``target``, then mark
    it migrated on ``source``. Rerunning after a crash at any point completes the move once."""
    _check_two_engines(source, target)
    check_wait_seconds(wait)
    info = await source.get_run(run_id)
    if info.status == RunStatus.MIGRATED:
        return RunMove(
            run_id=run_id,
            workflow_id=info.workflow_id,
            outcome="skipped",
            reason=f"already moved to {info.migrated_to}",
        )
    if info.status not in ACTIVE_RUN_STATUSES or info.status == RunStatus.COMPENSATING:
        return RunMove(
            run_id=run_id,
            workflow_id=info.workflow_id,
            outcome="skipped",
            reason=f"{info.status.value} runs stay where they are",
        )
    try:
        snapshot = await source.export_run(run_id, wait=wait)
    except MigrationError as exc:
        return RunMove(run_id=run_id, workflow_id=info.workflow_id, outcome="left", reason=str(exc))
    try:
        if blobs is None:
            blobs = _blob_stores(source, target)
        if blobs is not None:
            await copy_blobs(snapshot, *blobs)
        await target.import_run(snapshot)
    except BaseException as exc:
        if not isinstance(exc, MigrationError) and await _holds(target, run_id):
            # the import committed and what came after it failed: unfreezing the run here
            # left it active on both engines (each ran it). It stays frozen: a rerun finds
            # it on the target and completes the move.
            raise MigrationError(
                f"run {run_id!r} was imported into {target.driver_name} but the import then "
                f"failed ({type(exc).__name__}: {exc}); it stays frozen on "
                f"{source.driver_name}: fix the cause and run the migration again to finish "
                "the move"
            ) from exc
        await source.abort_export(run_id)
        raise
    await source.complete_export(run_id, target.driver_name)
    return RunMove(run_id=run_id, workflow_id=info.workflow_id, outcome="moved")


async def migrate_runs(
    source: WorkflowEngine,
    target: WorkflowEngine,
    *,
    workflow_ids: Sequence[str] | None = None,
    version: str | None = None,
    run_ids: Sequence[str] | None = None,
    statuses: Sequence[RunStatus] | None = None,
    dry_run: bool = False,
    drain: bool = False,
    wait: float = 30.0,
    drain_timeout: float = 300.0,
    blobs: tuple[BlobStore, BlobStore] | None = None,
    progress: Callable[[RunMove], None] | None = None,
) -> MigrationReport:
    """Move the selected active runs from ``source`` to ``target``.

    ``drain`` first stops ``source`` from taking new runs of the selected workflows (new starts
    must go to ``target``: route them there) and keeps migrating until none is left there.

    ``run_ids`` names the runs to consider (an empty list: none). Each is reported once: a
    run named there that is not active on ``source`` is reported ``skipped`` with its reason
    ("already moved to <driver>", "<status> runs stay where they are"), after the runs of
    the first pass; an active one that the other filters leave out is not reported. An id
    ``source`` does not hold raises RunNotFoundError before anything moves.
    """
    _check_two_engines(source, target)
    check_wait_seconds(wait)
    check_wait_seconds(drain_timeout, "drain_timeout")
    await _check_selection(source, workflow_ids, version, run_ids, statuses)
    if run_ids is not None:
        run_ids = list(dict.fromkeys(run_ids))  # (an id named twice is moved and reported once)
    report = MigrationReport(source=source.driver_name, target=target.driver_name, dry_run=dry_run)
    if drain:
        await _start_drain(source, target, workflow_ids, dry_run)
    select = partial(_select, source, workflow_ids, version, run_ids, statuses)
    deadline = time.monotonic() + drain_timeout
    done: set[str] = set()

    def record(move: RunMove) -> None:
        done.add(move.run_id)
        report.moves.append(move)
        if progress is not None:
            progress(move)

    first = True
    while True:
        for run_id in [c for c in await select() if c not in done]:
            move = await _move(source, target, run_id, dry_run=dry_run, wait=wait, blobs=blobs)
            if move is None:
                continue
            if move.outcome != "left" or not drain:  # a drain retries the runs it left
                record(move)
        if first:
            first = False
            for move in await _not_active(source, [r for r in run_ids or () if r not in done]):
                record(move)
        if not drain:
            return report
        left = [c for c in await select() if c not in done]
        if not left:
            return report
        if time.monotonic() > deadline:
            report.moves += await _left_by_timeout(source, left)
            return report
        await asyncio.sleep(0.1)


async def _move(
    source: WorkflowEngine,
    target: WorkflowEngine,
    run_id: str,
    *,
    dry_run: bool,
    wait: float,
    blobs: tuple[BlobStore, BlobStore] | None,
) -> RunMove | None:
    """Move one selected run (or say what moving it would do); None when it is gone."""
    try:
        if dry_run:
            return await _would_move(source, run_id)
        return await migrate_run(source, target, run_id, wait=wait, blobs=blobs)
    except RunNotFoundError:
        return None


async def _start_drain(
    source: WorkflowEngine,
    target: WorkflowEngine,
    workflow_ids: Sequence[str] | None,
    dry_run: bool,
) -> None:
    if dry_run:
        raise EngineError("--drain and --dry-run cannot be combined")
    if not workflow_ids:
        raise EngineError("--drain needs the workflows to drain (--workflow)")
    await source.drain(workflow_ids, target.driver_name)


async def _not_active(source: WorkflowEngine, run_ids: Sequence[str]) -> list[RunMove]:
    """A ``skipped`` move for each of ``run_ids`` (named by the caller, not moved) that is not
    active on ``source``: moved away earlier, or ended. ``migrate_runs(run_ids=[moved])``
    returned an empty report, and only the CLI said why."""
    moves = []
    for run_id in run_ids:
        try:
            info = await source.get_run(run_id)
        except RunNotFoundError:  # (there when the selection was checked; purged since)
            reason, workflow_id = f"no longer on {source.driver_name}", ""
        else:
            workflow_id = info.workflow_id
            if info.status == RunStatus.MIGRATED:
                reason = f"already moved to {info.migrated_to}"
            elif info.terminal:
                reason = f"{info.status.value} runs stay where they are"
            else:
                continue  # active, and left out by the other filters
        moves.append(
            RunMove(run_id=run_id, workflow_id=workflow_id, outcome="skipped", reason=reason)
        )
    return moves


async def _left_by_timeout(source: WorkflowEngine, left: list[str]) -> list[RunMove]:
    moves = []
    for run_id in left:
        info = await source.get_run(run_id)
        moves.append(
            RunMove(
                run_id=run_id,
                workflow_id=info.workflow_id,
                outcome="left",
                reason="drain timed out",
            )
        )
    return moves


async def abort_migration(
    source: WorkflowEngine, target: WorkflowEngine, run_ids: Sequence[str]
) -> MigrationReport:
    """Give back to ``source`` the named runs an interrupted migration left frozen there
    (``wfe migrate`` killed between a run's freeze and its move, a host crash): a frozen run
    takes no signal or cancel and runs no stage until something finishes or aborts its move,
    and nothing else ever did, so its signals were refused with "retry in a moment" for good.

    Each run is reported once: ``unfrozen`` (it goes on at ``source``; unfreezing a run that
    was not frozen changes nothing), or ``skipped`` with the reason: ``target`` already holds
    it (the import committed: unfreezing it here would leave it live on both drivers; migrate
    it again to finish the move), or it is not active on ``source`` (moved, ended). An id
    ``source`` does not hold raises RunNotFoundError before anything changes. Run it only
    while no migration of these runs is under way: one in progress imports the run after
    this looked at the target."""
    _check_two_engines(source, target)
    await _check_selection(source, None, None, run_ids, None)
    report = MigrationReport(source=source.driver_name, target=target.driver_name)
    for run_id in dict.fromkeys(run_ids):
        info = await source.get_run(run_id)
        move = RunMove(run_id=run_id, workflow_id=info.workflow_id, outcome="skipped")
        if info.status == RunStatus.MIGRATED:
            move.reason = f"already moved to {info.migrated_to}"
        elif info.status not in ACTIVE_RUN_STATUSES:
            move.reason = f"{info.status.value}: it is not frozen"
        elif await _holds(target, run_id, strict=True):  # (unknown: unfreeze nothing)
            move.reason = (
                f"{target.driver_name} already holds it (its import committed): migrate it "
                "again, without --abort, to finish the move"
            )
        else:
            await source.abort_export(run_id)
            move.outcome = "unfrozen"
            move.reason = f"it goes on at {source.driver_name}"
        report.moves.append(move)
    return report


# the statuses a run can move in (a compensating run finishes where it is)
_MOVABLE = tuple(s for s in RunStatus if s in ACTIVE_RUN_STATUSES and s != RunStatus.COMPENSATING)


async def _check_selection(
    source: WorkflowEngine,
    workflow_ids: Sequence[str] | None,
    version: str | None,
    run_ids: Sequence[str] | None,
    statuses: Sequence[RunStatus] | None,
) -> None:
    """What ``migrate_runs`` selects by, checked before anything moves: a misspelled status,
    an id given as a string instead of a list, or a run that is not on ``source`` selected
    nothing and reported an empty move (``wfe migrate --run nope``: "moved: 0")."""
    if workflow_ids is not None:
        check_workflow_ids(workflow_ids)
    if version is not None:
        check_version(version)
    if statuses is not None:
        check_list_call(None, statuses, 0, None)
        ended = [str(s) for s in statuses if RunStatus(s) not in _MOVABLE]
        if ended:
            raise InvalidInputError(
                None,
                f"runs that are {', '.join(ended)} never move (only active runs do); select "
                f"among {', '.join(s.value for s in _MOVABLE)}",
                ("statuses",),
            )
    if run_ids is None:
        return
    if isinstance(run_ids, str | bytes) or not isinstance(run_ids, Iterable):
        raise InvalidInputError(
            None, f"run_ids must be a list of run ids, not {type(run_ids).__name__}", ("run_ids",)
        )
    for run_id in run_ids:
        await source.get_run(check_run_call(run_id))  # RunNotFoundError: say which


async def _select(
    source: WorkflowEngine,
    workflow_ids: Sequence[str] | None,
    version: str | None,
    run_ids: Sequence[str] | None,
    statuses: Sequence[RunStatus] | None,
) -> list[str]:
    wanted = [s for s in (statuses or ACTIVE_RUN_STATUSES) if s in ACTIVE_RUN_STATUSES]
    if run_ids is not None:  # (an empty list selects none: it selected every active run)
        infos = []
        for rid in run_ids:
            try:
                infos.append(await source.get_run(rid))
            except RunNotFoundError:
                continue
    else:
        infos = []
        for wf in workflow_ids or [None]:  # type: ignore[list-item]
            infos += await source.list_runs(workflow_id=wf, status=wanted, limit=100_000)
    return [
        i.id
        for i in infos
        if i.status in wanted
        and (version is None or i.version == version)
        and (not workflow_ids or i.workflow_id in workflow_ids)
    ]


async def _would_move(source: WorkflowEngine, run_id: str) -> RunMove:
    info = await source.get_run(run_id)
    running = [s.id for s in info.stages if s.status == "running"]
    if info.status == RunStatus.COMPENSATING:
        return RunMove(
            run_id=run_id,
            workflow_id=info.workflow_id,
            outcome="left",
            reason="compensating: it finishes where it is",
        )
    if running:
        return RunMove(
            run_id=run_id,
            workflow_id=info.workflow_id,
            outcome="would_move",
            reason=f"after its running stage(s) {running} finish",
        )
    return RunMove(run_id=run_id, workflow_id=info.workflow_id, outcome="would_move")
