"""Scenario: listing runs by id prefix without reading their values (what ``wfe runs`` and
the CLI's unique-prefix run ids stand on)."""

from __future__ import annotations

from engine_port import MemorySink, Registry, StageContext, Workflow

from ._harness import Harness, eventually, unique_id
from ._models import Num

__all__ = ["ListingContract"]


class ListingContract:
    async def test_list_runs_by_id_prefix_without_values(self, harness: Harness) -> None:
        wf = Workflow(unique_id("listing"), input=Num)

        @wf.stage
        async def only(ctx: StageContext[Num]) -> int:
            return ctx.input.n

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            ids = [(await engine.start(wf.id, {"n": n})).id for n in (1, 2, 3)]
            for run_id in ids:
                await engine.wait(run_id, timeout=60)

            async def listed(id_prefix: str | None = None) -> list[str]:
                runs = await engine.list_runs(workflow_id=wf.id, id_prefix=id_prefix)
                return [r.id for r in runs]

            async def all_listed() -> bool:  # Temporal's visibility store catches up
                runs = await engine.list_runs(workflow_id=wf.id, outputs=False)
                # (ids first, the runs' last status a moment later: both caught up)
                return sorted(r.id for r in runs) == sorted(ids) and all(
                    r.status.value == "completed" for r in runs
                )

            await eventually(all_listed, timeout=30, what="all three runs listed")
            prefix = ids[1][: len(ids[1]) - 4]
            assert await listed(id_prefix=prefix) == [ids[1]]
            assert await listed(id_prefix=ids[1]) == [ids[1]]
            assert await listed(id_prefix="zz-no-such-") == []
            bare = await engine.list_runs(workflow_id=wf.id, id_prefix=prefix, outputs=False)
            assert [(r.status.value, r.input, r.output) for r in bare] == [
                ("completed", None, None)
            ]
            assert [s.output for s in bare[0].stages] == [None]
            full = await engine.list_runs(workflow_id=wf.id, id_prefix=prefix)
            assert (full[0].input, full[0].output) == ({"n": 2}, 2)
