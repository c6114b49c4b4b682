"""Pages of runs and a run without its spilled values, for the web view (``wfe ui``): the same
two calls the native driver offers, on Temporal's visibility list and the run's memo."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import AsyncIterator, Collection, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from temporalio.api.workflowservice.v1 import ListWorkflowExecutionsRequest
from temporalio.client import WorkflowExecution, WorkflowExecutionStatus

from engine_port import EngineSettings, RunInfo, RunStatus, is_spill_ref
from engine_port.driver import check_list_call, check_page_call, check_run_call
from engine_port.errors import InvalidInputError

from . import _rpc
from ._helpers import _quote
from ._query import matches_filters, recent_continues, runs_query, wanted_statuses
from ._search import SA_STATUS

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["PagedRuns", "list_page", "listed", "superseded"]

_MAX_CURSOR = 4000
_MAX_PAGE = 1000  # the most executions a visibility page holds (the server's own cap)


async def list_page(
    conn: Client,
    query: str,
    *,
    deadline_s: float,
    address: str | None,
    page_size: int = 1000,
    token: bytes | None = None,
) -> tuple[list[WorkflowExecution], bytes | None]:
    """One page of a visibility listing (what ``Client.list_workflows`` fetches) and the next
    page's token (None: the last), within ``deadline_s`` while Temporal is down (``_rpc.read``:
    ``list_workflows`` retries ~10 s on its own, whatever its ``rpc_timeout``)."""
    request = ListWorkflowExecutionsRequest(
        namespace=conn.namespace,
        # (a page_size past int32 raised a raw ValueError; the server caps pages at 1000)
        page_size=min(page_size, _MAX_PAGE),
        next_page_token=token or b"",
        query=query,
    )
    svc = conn.workflow_service
    resp = await _rpc.read(
        "a visibility listing",
        lambda timeout: svc.list_workflow_executions(request, retry=False, timeout=timeout),
        deadline_s=deadline_s,
        address=address,
    )
    # (as ``list_workflows`` builds them)
    page = [
        WorkflowExecution._from_raw_info(v, conn.namespace, conn.data_converter)
        for v in resp.executions
    ]
    return page, resp.next_page_token or None


async def listed(
    conn: Client, query: str, *, deadline_s: float, address: str | None
) -> AsyncIterator[WorkflowExecution]:
    """Every execution of a visibility listing, page by page (``list_page``)."""
    token: bytes | None = None
    while True:
        page, token = await list_page(
            conn, query, deadline_s=deadline_s, address=address, token=token
        )
        for ex in page:
            yield ex
        if token is None:
            return


async def superseded(
    conn: Client,
    executions: Sequence[WorkflowExecution],
    wanted: Collection[str],
    *,
    first: bool,
    deadline_s: float,
    address: str | None,
) -> set[str]:
    """The Temporal run ids among ``executions`` that are not their run's latest execution: a
    redrive or a continue-as-new starts a new execution under the run's id, and visibility
    keeps the closed one with the status it ended in, so a listing would show the run twice
    (and under a status it no longer has). Of two executions of one run listed together the
    older is dropped (visibility may list one that continued as new still running beside its
    new one, for a moment); one visibility query for the closed ones' ids. ``wanted``: the
    statuses listed; ``first``: no earlier page of the listing showed the run (visibility
    lists running executions before closed ones: a running successor of the statuses listed
    that a later page's query finds was on an earlier page)."""
    newest: dict[str, WorkflowExecution] = {}
    for ex in executions:
        seen = newest.get(ex.id)
        if seen is None or ex.start_time > seen.start_time:
            newest[ex.id] = ex
    older = {ex.run_id for ex in executions if newest[ex.id].run_id != ex.run_id}
    closed = [ex for ex in executions if ex.close_time is not None and ex.run_id not in older]
    if not closed:
        return older
    ids = ", ".join(f"'{_quote(i)}'" for i in sorted({ex.id for ex in closed}))
    latest: dict[str, WorkflowExecution] = {}
    query = f"WorkflowId IN ({ids})"
    async for ex in listed(conn, query, deadline_s=deadline_s, address=address):
        seen = latest.get(ex.id)
        if seen is None or ex.start_time > seen.start_time:
            latest[ex.id] = ex
    in_page = {ex.run_id for ex in executions}
    gone: set[str] = set()
    for ex in closed:
        last = latest.get(ex.id)
        if last is None or last.run_id == ex.run_id:
            continue
        if (
            first
            and ex.status == WorkflowExecutionStatus.CONTINUED_AS_NEW
            and last.status == WorkflowExecutionStatus.RUNNING
            and last.run_id not in in_page
            and last.typed_search_attributes.get(SA_STATUS) in wanted
        ):
            # its new execution is of the statuses listed, yet the listing, an instant
            # before this query, did not show it: the run is listed by this one
            continue
        gone.add(ex.run_id)
    return older | gone


def _digest(query: str, token: bytes) -> str:
    return hashlib.sha256(query.encode() + b"\x00" + token).hexdigest()[:16]


def _token(cursor: str, query: str) -> bytes:
    """Temporal's next_page_token behind a cursor this module gave for ``query``. The cursor
    carries a digest of the query and the token: a corrupted or forged token, another
    driver's cursor or one of another listing (other filters) went to the server, which
    answered UNKNOWN (DriverUnavailableError after 10 s of retries) or a page of the other
    listing's order."""
    encoded, _, digest = cursor.rpartition(".")
    try:
        if len(cursor) > _MAX_CURSOR or not encoded:
            raise ValueError
        token = base64.urlsafe_b64decode(encoded.encode("ascii") + b"=" * (-len(encoded) % 4))
        if not token or not hmac.compare_digest(digest, _digest(query, token)):
            raise ValueError
    except (ValueError, binascii.Error, UnicodeEncodeError):
        raise InvalidInputError(
            None,
            f"{cursor[:100]!r} is not a page cursor of this listing; use the one the previous "
            "page gave, with the same filters (or start again from the first page)",
        ) from None
    return token


def _cursor(token: bytes | None, query: str) -> str | None:
    if not token:
        return None
    encoded = base64.urlsafe_b64encode(token).decode("ascii").rstrip("=")
    return f"{encoded}.{_digest(query, token)}"


class PagedRuns:
    """Mixed into :class:`TemporalEngine`, which has what these declare."""

    if TYPE_CHECKING:
        settings: EngineSettings

        def _scope(self) -> str: ...

        def _reads(self) -> dict[str, Any]: ...

        @property
        def _conn(self) -> Client: ...

        async def _describe(self, run_id: str) -> tuple[Any, WorkflowExecutionStatus | None]: ...

        async def _note_signal_woke(self, run_id: str, memo: dict[str, Any]) -> None: ...

        async def _info_from_memo(
            self,
            memo: Any,
            status: WorkflowExecutionStatus | None,
            run_id: str | None = None,
            *,
            values: bool = True,
        ) -> RunInfo: ...

    @_rpc.surfaced("list_runs_page")
    async def list_runs_page(
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
    ) -> tuple[list[RunInfo], str | None]:
        """One page of :meth:`list_runs` (newest first) and the cursor of the next page (None
        on the last one): Temporal's own ``next_page_token``, so every filter is applied by
        the visibility query and a page costs the same however deep it is."""
        statuses = check_list_call(workflow_id, status, limit, id_prefix)
        created_after = check_page_call(after, version, created_after, idempotency_key)
        if limit == 0:
            return [], None
        filters: dict[str, Any] = {
            "workflow_id": workflow_id,
            "id_prefix": id_prefix,
            "version": version,
            "created_after": created_after,
            "idempotency_key": idempotency_key,
        }
        # (the cursor names the listing by its filters: its query lists the executions that
        # continued as new lately too, since a moment that differs from page to page)
        listing = runs_query(self._scope(), statuses or None, **filters)
        query = runs_query(
            self._scope(), statuses or None, continued_after=recent_continues(), **filters
        )
        token = _token(after, listing) if after is not None else None
        reads = self._reads()
        executions, next_token = await list_page(
            self._conn, query, page_size=limit, token=token, **reads
        )
        page: list[RunInfo] = []
        wanted = wanted_statuses(statuses or None)
        old = await superseded(self._conn, executions, wanted, first=after is None, **reads)
        for ex in executions:
            if ex.run_id in old or not matches_filters(
                ex, id_prefix=id_prefix, version=version, idempotency_key=idempotency_key
            ):
                continue
            memo = await ex.memo()
            if "wfe_run" in memo:
                page.append(await self._info_from_memo(memo, ex.status, values=outputs))
        return page, _cursor(next_token, listing)

    @_rpc.surfaced("get_run_lazy")
    async def get_run_lazy(self, run_id: str) -> tuple[RunInfo, dict[str, int]]:
        """:meth:`get_run` without reading the blob store: a spilled value is None in the
        RunInfo and its size in bytes is in the dict, under ``input``, ``stage:ID`` or
        ``output:ID`` (a sink's part of the run output), as on the native driver."""
        check_run_call(run_id)
        memo, status = await self._describe(run_id)
        await self._note_signal_woke(run_id, memo)
        info: dict[str, Any] = dict(memo.get("wfe_run") or {})
        spilled: dict[str, int] = {}

        def keep(value: Any, where: str) -> Any:
            if not is_spill_ref(value):
                return value
            ref = value[next(iter(value))]
            spilled[where] = int(ref.get("size", 0)) if isinstance(ref, dict) else 0
            return None

        if info:
            info["input"] = keep(info.get("input"), "input")
            info["stages"] = [
                {**s, "output": keep(s.get("output"), f"stage:{s.get('id')}")}
                for s in info.get("stages") or []
            ]
            sinks = set(info.get("sinks") or [])
            for where in list(spilled):
                if where.startswith("stage:") and where[6:] in sinks:
                    spilled[f"output:{where[6:]}"] = spilled[where]
        return await self._info_from_memo({**memo, "wfe_run": info}, status, run_id), spilled
