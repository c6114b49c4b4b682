"""The web view bench's bulk fill makes runs the engine reads exactly like the real ones they
were cloned from (bench/tools/ui_pages.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench.tools import ui_pages
from engine_port import EngineSettings, create_engine


@pytest.mark.postgres
def test_cloned_runs_read_like_their_templates(pg_session: Any) -> None:
    url = pg_session.new_schema()
    settings = EngineSettings(database_url=url)
    templates = asyncio.run(ui_pages.make_templates(settings))
    ui_pages.clone(url, templates, 200)

    async def check() -> None:
        async with create_engine(settings, ui_pages.registry()) as engine:
            runs = await engine.list_runs(limit=500)
            assert len(runs) == 206
            by_id = {r.id: r for r in runs}
            for template_id in templates:
                template = by_id[template_id]
                clones = [
                    r
                    for r in runs
                    if r.id not in templates
                    and (r.workflow_id, r.version, r.status, r.input)
                    == (template.workflow_id, template.version, template.status, template.input)
                ]
                assert clones, template.status
                clone = clones[0]
                assert clone.output == template.output and clone.error == template.error
                strip = {"started_at", "finished_at", "wake_at"}
                assert [s.model_dump(exclude=strip) for s in clone.stages] == [
                    s.model_dump(exclude=strip) for s in template.stages
                ]
                assert clone.idempotency_key and clone.idempotency_key != template.idempotency_key
                events = [(e.seq, e.type, e.stage) for e in await engine.events(clone.id)]  # type: ignore[attr-defined]
                assert events == [
                    (e.seq, e.type, e.stage)
                    for e in await engine.events(template_id)  # type: ignore[attr-defined]
                ]

    asyncio.run(check())


@pytest.mark.postgres
def test_the_clone_analyzes_only_the_engines_tables(pg_session: Any) -> None:
    """Its bare ANALYZE locked every table of the database in one transaction; the test
    session's database holds a schema per test, and once the suite had enough of them the
    clone failed with "out of shared memory" (max_locks_per_transaction)."""
    import sqlalchemy as sa

    other = pg_session.new_schema()  # another test's schema, with a table of its own
    engine = sa.create_engine(other.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE bystander (a int)"))
    url = pg_session.new_schema()
    templates = asyncio.run(ui_pages.make_templates(EngineSettings(database_url=url)))
    ui_pages.clone(url, templates, 10)
    with engine.begin() as conn:
        analyzed = conn.execute(
            sa.text(
                "SELECT last_analyze FROM pg_stat_user_tables "
                "WHERE relname = 'bystander' AND schemaname = current_schema()"
            )
        ).scalar_one()
    engine.dispose()
    assert analyzed is None
