"""The scratch area ``wfe conformance`` runs in: never the user's own runs, tables, task
queues, blobs or event sink, and removed afterwards.

- native on SQLite: a temporary database file;
- native on PostgreSQL: a schema of its own in the configured database, dropped afterwards;
- Temporal: task queues of its own (``conformance-<id>-...``, outside the user's
  ``task_queue`` prefix); its executions are terminated and deleted afterwards.

Blobs go to a temporary folder and the user's ``event_sink`` is not used (the suite has its
own in-memory sink), so the user's consumers never see a test event."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["scratch_settings"]

log = logging.getLogger("wfe.conformance")


@contextlib.contextmanager
def scratch_settings(settings: Any, *, own_blobs: bool = True) -> Iterator[Any]:
    """Settings for a scratch area derived from ``settings``; the area is removed on exit.
    ``own_blobs=False`` keeps the configured blob store (a throwaway container's)."""
    tag = uuid.uuid4().hex[:10]
    with tempfile.TemporaryDirectory(prefix="wfe-conformance-") as tmp:
        update: dict[str, Any] = {
            "event_sink": None,
            "routes": {},
            "app": None,
        }
        if own_blobs:
            update["blob_url"] = _secret(settings, f"file://{Path(tmp) / 'blobs'}")
        if settings.driver == "temporal":
            update["task_queue"] = f"conformance-{tag}"
            try:
                yield settings.model_copy(update=update)
            finally:
                _remove_temporal(settings, f"conformance-{tag}-")
            return
        url = settings.database_url.reveal()
        if url.startswith("postgresql"):
            schema = f"wfe_conformance_{tag}"
            _pg(url, f'CREATE SCHEMA "{schema}"')
            update["database_url"] = _secret(settings, _with_search_path(url, schema))
            try:
                yield settings.model_copy(update=update)
            finally:
                _pg(url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            return
        update["database_url"] = _secret(settings, f"sqlite:///{Path(tmp) / 'conformance.db'}")
        yield settings.model_copy(update=update)


def _with_search_path(url: str, schema: str) -> str:
    """``url`` with its connections' search_path set to ``schema`` (other options kept;
    the last ``-c`` of a name wins)."""
    import sqlalchemy as sa

    parsed = sa.make_url(url)
    options = parsed.query.get("options")
    given = " ".join(options) if isinstance(options, tuple) else (options or "")
    merged = f"{given} -csearch_path={schema}".strip()
    return parsed.update_query_dict({"options": merged}).render_as_string(hide_password=False)


def _secret(settings: Any, url: str) -> Any:
    return type(settings.database_url)(url)


def _pg(url: str, statement: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text(statement))
    finally:
        engine.dispose()


_DELETE_S = 90.0
"""How long the cleanup waits for its deleted runs to leave the listing (the dev server removes
a deleted execution lazily, up to ~30 s later, and later still when busy)."""
_SETTLED_S = 1.0
"""How long Temporal's visibility store must list none of the conformance runs before the
cleanup believes it (it lists a run that ended a moment ago only after a while)."""


def _remove_temporal(settings: Any, prefix: str) -> None:
    import asyncio

    try:
        asyncio.run(_remove_executions(settings, prefix))
    except Exception as exc:  # cleanup is best effort: say what is left
        log.warning("could not remove the conformance runs on %s*: %s", prefix, exc)


async def _remove_executions(settings: Any, prefix: str) -> None:
    import asyncio

    from temporalio.api.common.v1 import WorkflowExecution
    from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
    from temporalio.client import Client

    client = await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace)
    query = f"TaskQueue STARTS_WITH '{prefix}'"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _DELETE_S
    # the visibility store lags behind (a run that ended a moment ago may not be listed yet):
    # list and delete until it has shown none for a second
    empty_since: float | None = None
    while True:
        found = [
            (ex.id, ex.run_id, ex.close_time is not None)
            async for ex in client.list_workflows(query)
        ]
        if not found:
            if empty_since is None:
                empty_since = loop.time()
            elif loop.time() - empty_since >= _SETTLED_S:
                return
            await asyncio.sleep(0.25)
            continue
        empty_since = None
        if loop.time() > deadline:
            log.warning(
                "%d conformance runs on task queues %s* are left; delete them with "
                "'temporal workflow delete --query \"%s\"'",
                len(found),
                prefix,
                query,
            )
            return
        # an execution closed a moment ago but still listed as running is deleted only once
        # the listing shows it closed: deleted before, its late close record could bring it
        # back into the listing after the delete
        found = [f for f in found if await _deletable(client, *f)]
        for workflow_id, run_id, _ in found:
            with contextlib.suppress(Exception):  # already being deleted
                await client.workflow_service.delete_workflow_execution(
                    DeleteWorkflowExecutionRequest(
                        namespace=settings.temporal_namespace,
                        workflow_execution=WorkflowExecution(
                            workflow_id=workflow_id, run_id=run_id
                        ),
                    )
                )
        await asyncio.sleep(0.5)


async def _deletable(client: Any, workflow_id: str, run_id: str, listed_closed: bool) -> bool:
    """Delete it now: listed as closed, or really running (a delete terminates it)."""
    if listed_closed:
        return True
    from temporalio.client import WorkflowExecutionStatus

    try:
        desc = await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
    except Exception:
        return True
    return bool(desc.status == WorkflowExecutionStatus.RUNNING)
