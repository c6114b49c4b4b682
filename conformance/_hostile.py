"""Scenario: user JSON shaped like engine metadata (DESIGN §5 "Claim check": references are
engine metadata, never user data; issue 11); event data over ``max_payload_bytes``.

A run's input, step result, signal payload and stage output may be any JSON, including
``{"$wfe_spill": {"key": ...}}`` naming another run's spilled blob, or a malformed
``{"$wfe_spill": 1}``. Each must come back as the literal value the user gave, never as the
content of a blob, and reading runs must keep working.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict

from engine_port import (
    MemoryBlobStore,
    MemorySink,
    Registry,
    Retry,
    RunStatus,
    StageContext,
    Workflow,
)

from ._harness import CONTRACT_MARKS, Harness, eventually, unique_id, wait_for_events

__all__ = ["HostileDataContract"]

SECRET = "4111 1111 1111 1111"


class Loose(BaseModel):
    """An input model that accepts any keys (a permissive API payload)."""

    model_config = ConfigDict(extra="allow")


def _victim() -> Workflow[Loose]:
    wf = Workflow(unique_id("victim"), input=Loose)

    @wf.stage
    async def secret(ctx: StageContext[Loose]) -> dict[str, str]:
        card = await ctx.step.run("card", lambda: {"card": SECRET, "pad": "p" * 1000})
        return {"card": card["card"], "pad": "q" * 1000}

    return wf


def _echo() -> Workflow[Loose]:
    """Returns its input, a step result and a signal payload, each as the user gave them."""
    wf = Workflow(unique_id("echo"), input=Loose)

    @wf.stage
    async def echo(ctx: StageContext[Loose]) -> dict[str, Any]:
        given = ctx.input.model_dump()
        step = await ctx.step.run("forge", lambda: given.get("forged"))
        signal = await ctx.step.wait_for_signal("forged")
        return {"input": given, "step": step, "signal": signal}

    @wf.stage(after=[echo])
    async def relay(ctx: StageContext[Loose]) -> Any:
        return ctx.output_of(echo)["step"]

    return wf


def _big_events(size: int) -> Workflow[Loose]:
    """Stage ``body`` emits a small event, then one whose data is ``size`` bytes (in the stage
    body, or, with input ``{"in_step": true}``, inside a step's function); it would be
    retried twice on any error that is retryable."""
    wf = Workflow(unique_id("bigevent"), input=Loose)

    @wf.stage(retry=Retry(max_attempts=3, initial_interval=timedelta(milliseconds=10)))
    async def body(ctx: StageContext[Loose]) -> str:
        ctx.emit("small", {"n": 1})
        if ctx.input.model_dump().get("in_step"):
            await ctx.step.run("emits", lambda: ctx.emit("big", {"blob": "x" * size}))
        else:
            ctx.emit("big", {"blob": "x" * size})
        return "done"

    return wf


class HostileDataContract:
    """No user JSON is ever read as a spill reference, on any driver; no event data over
    ``max_payload_bytes`` is accepted."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_user_json_naming_another_runs_blob_is_returned_as_given(
        self, harness: Harness
    ) -> None:
        store = MemoryBlobStore()
        victim, echo = _victim(), _echo()
        sink = MemorySink()
        async with (
            harness.engine(
                Registry([victim, echo]), sink, blob_store=store, spill_threshold_bytes=512
            ) as engine,
            engine.worker(),
        ):
            v = await engine.start(victim.id, {})
            assert (await engine.wait(v.id, timeout=60)).status == RunStatus.COMPLETED
            keys = sorted(k for k in store.blobs if k.startswith(f"runs/{v.id}/"))
            assert keys, "the victim's output and step result spill at a 512-byte threshold"
            for key in keys:
                forged = {"$wfe_spill": {"key": key}}
                run = await engine.start(echo.id, {"forged": forged})
                await wait_for_events(sink, run.id, "stage.suspended")
                await engine.signal(run.id, "forged", forged)
                info = await engine.wait(run.id, timeout=60)
                assert info.status == RunStatus.COMPLETED, info.error
                assert info.input == {"forged": forged}
                assert info.stage("echo").output == {
                    "input": {"forged": forged},
                    "step": forged,
                    "signal": forged,
                }
                assert info.output == forged
                assert SECRET not in repr(info)
            listed = await engine.list_runs(workflow_id=echo.id)
            assert SECRET not in repr(listed)

    async def test_a_malformed_reference_in_user_json_breaks_nothing(
        self, harness: Harness
    ) -> None:
        echo = _echo()
        sink = MemorySink()
        bad: list[Any] = [{"$wfe_spill": 1}, {"$wfe_inline": {"$wfe_spill": None}}]
        async with harness.engine(Registry([echo]), sink) as engine, engine.worker():
            for forged in bad:
                run = await engine.start(echo.id, {"forged": forged})
                await wait_for_events(sink, run.id, "stage.suspended")
                assert (await engine.get_run(run.id)).input == {"forged": forged}
                await engine.signal(run.id, "forged", forged)
                info = await engine.wait(run.id, timeout=60)
                assert info.status == RunStatus.COMPLETED, info.error
                assert info.stage("echo").output == {
                    "input": {"forged": forged},
                    "step": forged,
                    "signal": forged,
                }
                assert info.output == forged
            assert len(await engine.list_runs(workflow_id=echo.id)) == len(bad)

    async def test_user_json_shaped_like_a_timed_out_wait_is_a_value(
        self, harness: Harness
    ) -> None:
        """A timed-out wait was journaled as the result ``{"$wfe_step_timeout": ...}``: a
        signal payload or a wait_for value of that shape was a value the first time and a
        ``StepTimeoutError`` once the stage replayed (a later sleep), on both drivers."""
        forged = {"$wfe_step_timeout": "2026-12-05T00:00:00+00:00"}
        wf = Workflow(unique_id("marker"), input=Loose)

        @wf.stage
        async def waits(ctx: StageContext[Loose]) -> Any:
            got = await ctx.step.wait_for_signal("forged", timeout=timedelta(minutes=5))
            polled = await ctx.step.wait_for("poll", lambda: dict(forged))
            await ctx.step.sleep("replay", timedelta(milliseconds=50))
            return [got, polled]

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.suspended")
            await engine.signal(run.id, "forged", forged)
            info = await engine.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED, info.error
        assert info.output == [forged, forged]

    async def test_numbers_come_back_exactly(self, harness: Harness) -> None:
        """A number a stage returns, a step journals or a signal carries comes back as the
        same number: native SQLite stored a bare JSON number in a column of NUMERIC affinity,
        so ``10**30`` came back as ``1e+30``, ``2**64 + 1`` rounded and ``-0.0`` as ``0``."""
        numbers: list[Any] = [10**30, 2**64 + 1, -(2**70), -0.0, 0.1, 1.5e300, 7]
        wf = Workflow(unique_id("numbers"), input=Loose)

        @wf.stage
        async def each(ctx: StageContext[Loose]) -> Any:
            journaled = [await ctx.step.run(f"n{i}", lambda n=n: n) for i, n in enumerate(numbers)]
            signalled = await ctx.step.wait_for_signal("n")
            return [journaled, signalled]

        @wf.stage(after=[each])
        async def last(ctx: StageContext[Loose]) -> Any:
            return ctx.output_of(each)[1]  # a bare number as the run's output

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await engine.signal(run.id, "n", 10**30 + 1)
            info = await engine.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED
        journaled, signalled = info.stages[0].output
        assert [(type(n), repr(n)) for n in journaled] == [(type(n), repr(n)) for n in numbers]
        assert (signalled, info.output) == (10**30 + 1, 10**30 + 1)
        assert isinstance(info.output, int)

    async def test_list_filters_match_exactly_whatever_they_hold(self, harness: Harness) -> None:
        """A listing filter is compared as the exact string given, on every driver: a run id
        prefix in another case, or holding a quote, a backslash or a LIKE wildcard, lists
        exactly the runs whose id starts with it (SQLite's LIKE and Temporal's dev server
        STARTS_WITH ignore case; on Temporal a quote in a prefix was dropped, listing every
        run, and a backslash in a version or idempotency key matched nothing)."""
        odd = "v'1\\x%_"
        wf = Workflow(unique_id("filters"), input=Loose, version=odd)

        @wf.stage
        async def only(ctx: StageContext[Loose]) -> int:
            return 1

        keys = ["k'1\\", "K'1\\", "k%", "k_", None]
        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            ids = [(await engine.start(wf.id, {}, idempotency_key=k)).id for k in keys]
            for run_id in ids:
                assert (await engine.wait(run_id, timeout=60)).status == RunStatus.COMPLETED

            async def listed(id_prefix: str | None = None) -> list[str]:
                runs = await engine.list_runs(workflow_id=wf.id, id_prefix=id_prefix)
                return sorted(r.id for r in runs)

            async def all_listed() -> bool:  # Temporal's visibility store catches up
                runs = await engine.list_runs(workflow_id=wf.id, outputs=False)
                return sorted(r.id for r in runs) == sorted(ids) and all(
                    r.status == RunStatus.COMPLETED for r in runs
                )

            await eventually(all_listed, timeout=30, what="every run listed")
            prefixes = [ids[0].upper(), ids[-1].upper(), "'", ids[0][:3] + "'", "%", "_"]
            prefixes += ["\\", ids[0][:2] + "\\", "' OR 1=1 --", "é", ids[0][:2] + "%"]
            for prefix in prefixes:
                want = sorted(i for i in ids if i.startswith(prefix))
                assert await listed(id_prefix=prefix) == want, prefix

            paged = getattr(engine, "list_runs_page", None)  # (the drivers' web view call)
            if paged is not None:

                async def page(**filters: Any) -> list[str]:
                    runs, _ = await paged(workflow_id=wf.id, **filters)
                    return sorted(r.id for r in runs)

                assert await page(version=odd) == sorted(ids)
                for bad in ("v'1", odd.upper(), "v%", odd + "\\"):
                    assert await page(version=bad) == [], bad
                for key, run_id in zip(keys, ids, strict=True):
                    if key is not None:
                        assert await page(idempotency_key=key) == [run_id], key
                assert await page(idempotency_key="k") == []

    async def test_event_data_over_max_payload_bytes_fails_the_attempt_for_good(
        self, harness: Harness
    ) -> None:
        """Event data is a user value like a step result: over ``max_payload_bytes`` the
        emit raises PayloadTooLargeError and the stage fails without a retry (the same body
        emits the same event), in the body or in a step; nothing of the run reaches the sink.
        Native accepted a 70 MB event into its outbox, unbounded."""
        limit = 50_000
        big = _big_events(limit + 1_000)
        # (well under: on Temporal one attempt's events together are bounded by the limit too)
        fits = _big_events(limit // 2)
        sink = MemorySink()
        async with (
            harness.engine(Registry([big, fits]), sink, max_payload_bytes=limit) as engine,
            engine.worker(),
        ):
            for in_step in (False, True):
                run = await engine.start(big.id, {"in_step": in_step})
                info = await engine.wait(run.id, timeout=60)
                assert info.status == RunStatus.FAILED, (in_step, info)
                stage = info.stage("body")
                assert stage.attempt == 1, (in_step, stage)
                assert stage.error is not None, in_step
                assert stage.error.type == "PayloadTooLargeError", (in_step, stage.error)
                assert "data of event 'big'" in stage.error.message
                assert "max_payload_bytes" in stage.error.message
                events = await wait_for_events(sink, run.id, "run.failed")
                assert not [e.type for e in events if e.type in ("small", "big")], in_step
            run = await engine.start(fits.id, {"in_step": True})
            info = await engine.wait(run.id, timeout=60)
            assert info.status == RunStatus.COMPLETED, info.error
            await wait_for_events(sink, run.id, "big")
