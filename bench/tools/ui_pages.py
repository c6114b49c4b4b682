"""What the web view's pages cost with many runs on PostgreSQL (issue 18):
``python bench/tools/ui_pages.py [N]`` (default 100,000 runs).

In a fresh PostgreSQL database on the server at WFE_TEST_POSTGRES_URL (default 127.0.0.1:5432)
a real engine and worker make six template runs of a 3-stage workflow (completed on version 1
and 2, failed, suspended waiting for a signal, pending, and one of a second workflow). Then
N runs are cloned from them with bulk SQL (``INSERT ... SELECT`` over ``generate_series``):
every row of a template in every table keyed by run (runs, stages, jobs, step ledger,
signals, outbox) is copied with a new run id, a new idempotency key, new event ids and its
times shifted, so each clone is shaped exactly like a run the engine made. The runs are
created 0.5 s apart, the newest a minute ago; statuses mix as 85 % completed v1, 5 % completed
v2, 3 % failed, 4 % suspended, 1 % pending, 2 % the other workflow.

Then it times, median of 15, each page of ``wfe ui`` (through Starlette's TestClient, in
process, so the HTML rendering is counted): the first page, a deep page (the cursor of the
61st oldest run), each filter, search by run id prefix / idempotency key / run id, and a
run page; and prints the PostgreSQL plan of each list query (``EXPLAIN ANALYZE``).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import sqlalchemy as sa
from pydantic import BaseModel
from starlette.testclient import TestClient

from driver_native._runs import runs_query
from driver_native._schema import metadata, runs
from engine_port import (
    EngineSettings,
    NonRetryableError,
    Registry,
    StageContext,
    Workflow,
    create_engine,
)
from tests.support.databases import PostgresSession
from wfe_ui import create_app


class In(BaseModel):
    i: int
    fail: bool = False
    wait: bool = False


def flow(workflow_id: str, version: str) -> Workflow[In]:
    wf: Workflow[In] = Workflow(workflow_id, input=In, version=version)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return ctx.input.i

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> int:
        if ctx.input.wait:
            await ctx.step.wait_for_signal("go")
        return 2

    @wf.stage(after=[b])
    async def c(ctx: StageContext[In]) -> int:
        if ctx.input.fail:
            raise NonRetryableError("the bench fails this run")
        return 3

    return wf


def registry() -> Registry:
    return Registry([flow("ui-bench", "1"), flow("ui-bench", "2"), flow("ui-other", "1")])


# (share of every 100 runs, workflow, version, input, ends): what each template run is
TEMPLATES = [
    (85, "ui-bench", "1", {"i": 1}, "completed"),
    (5, "ui-bench", "2", {"i": 2}, "completed"),
    (3, "ui-bench", "1", {"i": 3, "fail": True}, "failed"),
    (4, "ui-bench", "2", {"i": 4, "wait": True}, "suspended"),
    (1, "ui-bench", "1", {"i": 5}, "pending"),
    (2, "ui-other", "1", {"i": 6}, "completed"),
]


async def make_templates(settings: EngineSettings) -> list[str]:
    """One real run per template, made by the engine and a worker."""
    async with create_engine(settings, registry()) as engine:
        ids: list[str | None] = [None] * len(TEMPLATES)
        async with engine.worker():
            for n, (_share, wf, version, data, ends) in enumerate(TEMPLATES):
                if ends == "pending":
                    continue
                run = await engine.start(wf, data, version=version, idempotency_key=f"tpl-{n}")
                deadline = time.monotonic() + 60
                while (await engine.get_run(run.id)).status != ends:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"template {n} did not reach {ends}")
                    await asyncio.sleep(0.05)
                ids[n] = run.id
        for n, (_share, wf, version, data, ends) in enumerate(TEMPLATES):
            if ends == "pending":  # no worker any more: it stays pending
                ids[n] = (
                    await engine.start(wf, data, version=version, idempotency_key=f"tpl-{n}")
                ).id
        return [i for i in ids if i is not None]


def clone(url: str, templates: list[str], n: int) -> None:
    """N runs cloned from the templates with INSERT ... SELECT, table by table."""
    db = sa.create_engine(url)
    mapping = sa.table(
        "bench_map",
        sa.column("g", sa.Integer),
        sa.column("new_id", sa.String),
        sa.column("template_id", sa.String),
        sa.column("shift", sa.Double),
    )
    with db.begin() as conn:
        now = time.time()
        conn.execute(
            sa.text(
                "CREATE TEMP TABLE bench_map (g int, new_id varchar(64), template_id "
                "varchar(64), shift double precision) ON COMMIT DROP"
            )
        )
        lo = 0
        for (share, *_rest), template in zip(TEMPLATES, templates, strict=True):
            created = conn.execute(sa.select(runs.c.created_at).where(runs.c.id == template))
            conn.execute(
                sa.text(
                    "INSERT INTO bench_map SELECT g, md5('ui-bench-' || g), :tid, "
                    ":newest - (:n - g) * 0.5 - :created FROM generate_series(1, :n) g "
                    "WHERE g % 100 >= :lo AND g % 100 < :hi"
                ),
                {
                    "tid": template,
                    "newest": now - 60,
                    "n": n,
                    "created": created.scalar_one(),
                    "lo": lo,
                    "hi": lo + share,
                },
            )
            lo += share
        for table in metadata.sorted_tables:
            key = table.c.get("id") if table is runs else table.c.get("run_id")
            if key is None:
                continue
            cols, exprs = [], []
            for col in table.columns:
                if col.primary_key and col.autoincrement is True and col.name == "id":
                    continue  # a serial id: the database numbers the copies
                if col is key:
                    expr: Any = mapping.c.new_id
                elif col.name == "idempotency_key" and table is runs:
                    expr = sa.literal("bench-key-") + sa.cast(mapping.c.g, sa.String)
                elif col.name == "event_id":
                    expr = sa.func.md5(mapping.c.new_id + col)
                elif isinstance(col.type, sa.Double):
                    expr = col + mapping.c.shift
                else:
                    expr = col
                cols.append(col.name)
                exprs.append(expr)
            conn.execute(
                table.insert().from_select(
                    cols,
                    sa.select(*exprs).select_from(
                        table.join(mapping, key == mapping.c.template_id)
                    ),
                )
            )
        # the engine's tables only: a bare ANALYZE locks every table of the database in one
        # transaction, and the test session's database holds a schema per test (it ran out
        # of max_locks_per_transaction once the suite had enough of them)
        conn.execute(sa.text("ANALYZE " + ", ".join(t.name for t in metadata.sorted_tables)))
    db.dispose()


def query_of(call: dict[str, Any]) -> Any:
    """The run rows query that ``list_runs_page(**call)`` runs (limit + 1: is there more?)."""
    after = call.get("after")
    since = call.get("created_after")
    return runs_query(
        call.get("workflow_id"),
        call.get("status"),
        call.get("limit", 50) + 1,
        None if after is None else (float(after.split("~")[0]), after.split("~", 1)[1]),
        call.get("id_prefix"),
        call.get("version"),
        None if since is None else since.timestamp(),
        call.get("idempotency_key"),
    )


async def port_times(settings: EngineSettings, cases: list[list[dict[str, Any]]]) -> list[float]:
    """Median ms of the bare list_runs_page calls behind each page (no values read)."""
    async with create_engine(settings, registry()) as engine:
        paged = engine.list_runs_page  # type: ignore[attr-defined]
        out = []
        for calls in cases:
            samples = []
            for _ in range(15):
                t0 = time.perf_counter()
                for call in calls:
                    await paged(**{"limit": 50, **call}, outputs=False)
                samples.append((time.perf_counter() - t0) * 1000)
            out.append(statistics.median(samples))
        return out


def median_ms(fn: Callable[[], Any], times: int = 15) -> float:
    samples = []
    for _ in range(times):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    logging.getLogger("wfe").setLevel(logging.CRITICAL)  # the failed template's traceback
    pg = PostgresSession()
    try:
        url = pg.new_schema()
        settings = EngineSettings(database_url=url)
        t0 = time.perf_counter()
        templates = asyncio.run(make_templates(settings))
        clone(url, templates, n)
        print(f"{n} runs cloned from {len(templates)} real ones in {time.perf_counter() - t0:.0f}s")
        db = sa.create_engine(url)
        with db.connect() as conn:
            counts = conn.execute(
                sa.text("SELECT status, count(*) FROM wfe_runs GROUP BY status ORDER BY 1")
            ).all()
            print("runs:", ", ".join(f"{s} {c}" for s, c in counts))
            deep = conn.execute(
                sa.select(runs.c.created_at, runs.c.id)
                .order_by(runs.c.created_at, runs.c.id)
                .offset(60)
                .limit(1)
            ).one()
            old = conn.execute(
                sa.select(runs.c.id, runs.c.idempotency_key)
                .order_by(runs.c.created_at, runs.c.id)
                .offset(10)
                .limit(1)
            ).one()
            mid = conn.execute(
                sa.select(runs.c.id).order_by(runs.c.created_at).offset(n // 2).limit(1)
            ).scalar_one()
        cursor = f"{deep.created_at!r}~{deep.id}"
        hour_ago = datetime.now(UTC) - timedelta(hours=1)
        # (label, the page's query string, the list_runs_page calls behind it)

        def search(q: str) -> list[dict[str, Any]]:  # the two calls of a search
            return [{"id_prefix": q}, {"idempotency_key": q, "limit": 1}]

        cases: list[tuple[str, dict[str, str], list[dict[str, Any]]]] = [
            ("first page (50)", {}, [{}]),
            ("first page (200)", {"limit": "200"}, [{"limit": 200}]),
            ("deep page (cursor of the 61st oldest)", {"after": cursor}, [{"after": cursor}]),
            ("workflow=ui-other (2 %)", {"workflow": "ui-other"}, [{"workflow_id": "ui-other"}]),
            ("status=failed (3 %)", {"status": "failed"}, [{"status": ["failed"]}]),
            ("status=pending (1 %)", {"status": "pending"}, [{"status": ["pending"]}]),
            ("status=cancelled (none)", {"status": "cancelled"}, [{"status": ["cancelled"]}]),
            ("version=2 (9 %)", {"version": "2"}, [{"version": "2"}]),
            ("since=1h", {"since": "1h"}, [{"created_after": hour_ago}]),
            (
                "workflow+status+version",
                {"workflow": "ui-bench", "status": "suspended", "version": "2"},
                [{"workflow_id": "ui-bench", "status": ["suspended"], "version": "2"}],
            ),
            ("q=id prefix (6)", {"q": mid[:6]}, search(mid[:6])),
            ("q=idempotency key", {"q": old.idempotency_key}, search(old.idempotency_key)),
            ("q=run id", {"q": old.id}, search(old.id)),
        ]
        plans: list[str] = []
        with db.connect() as conn:
            for label, _params, calls in cases:
                for call in calls:
                    sql = query_of(call).compile(
                        dialect=db.dialect, compile_kwargs={"literal_binds": True}
                    )
                    plan = conn.execute(sa.text(f"EXPLAIN ANALYZE {sql}")).scalars().all()
                    plans.append(f"-- {label}: {call}\n" + "\n".join(plan))
        port = asyncio.run(port_times(settings, [calls for _l, _p, calls in cases]))
        with TestClient(create_app(create_engine(settings, registry()))) as client:
            harness = median_ms(lambda: client.get("/static/style.css"))
            print(f"TestClient round trip of a static file (harness cost): {harness:.1f} ms")
            print(f"{'page':<40}{'page ms':>9}{'port ms':>9}{'runs':>6}")
            for (label, params, _calls), port_ms in zip(cases, port, strict=True):
                answer = client.get("/runs", params=params)
                assert answer.status_code == 200, (label, answer.text[:500])
                shown = answer.text.count('class="run-link"')
                ms = median_ms(lambda p=params: client.get("/runs", params=p))  # type: ignore[misc]
                print(f"{label:<40}{ms:>9.1f}{port_ms:>9.1f}{shown:>6}")
            for label, run_id in (("run page (completed)", old.id), ("run page (suspended)", mid)):
                assert client.get(f"/runs/{run_id}").status_code == 200
                ms = median_ms(lambda r=run_id: client.get(f"/runs/{r}"))  # type: ignore[misc]
                print(f"{label:<40}{ms:>9.1f}")
        print("\nPostgreSQL plans of the run rows query of each call:\n")
        print("\n\n".join(plans))
        db.dispose()
    finally:
        pg.close()


if __name__ == "__main__":
    main()
