"""The StageRunner against an InMemoryLedger: replay, durable steps, failures, hooks, cancel."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    Completed,
    Failed,
    FakeClock,
    InMemoryLedger,
    Registry,
    Retry,
    StageContext,
    StageRequest,
    StageRunner,
    Suspended,
    Workflow,
)
from engine_port.errors import NonRetryableError, PayloadTooLargeError, StepTimeoutError


class In(BaseModel):
    n: int = 0


class Out(BaseModel):
    value: int
    label: str = ""


class Flaky(Exception):
    pass


class Fatal(Exception):
    pass


class FatalChild(Fatal):
    pass


class Harness:
    """One workflow, a registry, a fake clock, a runner, a ledger and counters kept outside
    the runner."""

    def __init__(self, wf_id: str = "wf", hooks: tuple[str, ...] = ()) -> None:
        self.wf: Workflow[In] = Workflow(wf_id, input=In, hooks=hooks)
        self.registry = Registry()
        self.clock = FakeClock()
        self.runner = StageRunner(self.registry, self.clock)
        self.ledger = InMemoryLedger()
        self.counts: Counter[str] = Counter()

    def count(self, name: str, value: Any = None) -> Any:
        self.counts[name] += 1
        return value

    def request(
        self,
        stage: str,
        *,
        attempt: int = 1,
        input: Any = None,
        outputs: dict[str, Any] | None = None,
        cancel_event: asyncio.Event | None = None,
    ) -> StageRequest:
        return StageRequest(
            run_id="run-1",
            workflow=self.wf,
            stage_id=stage,
            attempt=attempt,
            input={"n": 7} if input is None else input,
            outputs=outputs or {},
            cancel_event=cancel_event,
        )

    async def run(self, stage: str, **kwargs: Any) -> Any:
        return await self.runner.run(self.request(stage, **kwargs), self.ledger)


@pytest.fixture
def h() -> Harness:
    return Harness()


def failed(outcome: Any) -> Failed:
    assert isinstance(outcome, Failed), outcome
    return outcome


def completed(outcome: Any) -> Completed:
    assert isinstance(outcome, Completed), outcome
    return outcome


def suspended(outcome: Any) -> Suspended:
    assert isinstance(outcome, Suspended), outcome
    return outcome


# -- replay and sleep ------------------------------------------------------------------------


async def test_completed_step_is_not_run_again_on_replay(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> int:
        h.count("body")
        x = await ctx.step.run("x", h.count, "x", 41)
        await ctx.step.sleep("nap", timedelta(seconds=10))
        y = await ctx.step.run("y", h.count, "y", 1)
        return int(x + y)

    suspended(await h.run("s"))
    assert h.counts == {"body": 1, "x": 1}
    h.clock.advance(10)
    assert completed(await h.run("s")).output == 42
    assert h.counts == {"body": 2, "x": 1, "y": 1}


async def test_sleep_suspends_until_now_plus_duration_and_the_deadline_does_not_slide(
    h: Harness,
) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> str:
        await ctx.step.sleep("nap", timedelta(minutes=5))
        return "awake"

    t0 = h.clock.now()
    first = suspended(await h.run("s"))
    assert (first.reason, first.until, first.waiting_for) == (
        "sleep",
        t0 + timedelta(minutes=5),
        "sleep:nap",
    )
    h.clock.advance(timedelta(minutes=3))
    again = suspended(await h.run("s"))
    assert again.until == t0 + timedelta(minutes=5)
    h.clock.advance(timedelta(minutes=2))  # exactly at the deadline
    assert completed(await h.run("s")).output == "awake"
    rec = h.ledger.records["nap"]
    assert rec.completed and rec.deadline == t0 + timedelta(minutes=5)


async def test_sleep_accepts_seconds_and_a_zero_sleep_does_not_suspend(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> str:
        await ctx.step.sleep("zero", 0)
        await ctx.step.sleep("short", 1.5)
        return "done"

    t0 = h.clock.now()
    assert suspended(await h.run("s")).until == t0 + timedelta(seconds=1.5)
    h.clock.advance(2)
    assert completed(await h.run("s")).output == "done"


async def test_typed_step_result_is_the_same_on_first_run_and_on_replay(h: Harness) -> None:
    seen: list[Any] = []

    def make_out() -> Out:
        h.count("make")
        return Out(value=3, label="x")

    @h.wf.stage
    async def s(ctx: StageContext[In]) -> Out:
        out: Out = await ctx.step.run("make", make_out)
        seen.append(out)
        await ctx.step.sleep("nap", 1)
        return out

    suspended(await h.run("s"))
    h.clock.advance(1)
    assert completed(await h.run("s")).output == {"value": 3, "label": "x"}
    assert seen == [Out(value=3, label="x")] * 2
    assert h.counts["make"] == 1
    assert h.ledger.records["make"].result == {"value": 3, "label": "x"}


async def test_a_step_that_raised_is_not_recorded_and_runs_again(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> int:
        def flaky() -> int:
            h.count("flaky")
            if h.counts["flaky"] == 1:
                raise Flaky("first call fails")
            return 5

        return int(await ctx.step.run("flaky", flaky))

    first = failed(await h.run("s"))
    assert first.retryable and first.error.type == "Flaky"
    assert "flaky" not in h.ledger.records
    assert completed(await h.run("s", attempt=2)).output == 5
    assert h.counts["flaky"] == 2


# -- signals ---------------------------------------------------------------------------------


async def test_wait_for_signal_suspends_then_returns_the_payload(h: Harness) -> None:
    @h.wf.stage
    async def w(ctx: StageContext[In]) -> dict[str, Any]:
        payload = await ctx.step.wait_for_signal("go")
        return {"got": payload}

    s = suspended(await h.run("w"))
    assert (s.reason, s.until, s.waiting_for) == ("signal", None, "signal:go")
    suspended(await h.run("w"))  # still nothing
    h.ledger.push("go", {"n": 1})
    assert completed(await h.run("w")).output == {"got": {"n": 1}}
    assert h.ledger.consumed == ["go"]
    # a later replay returns the journaled payload even though the buffer is empty now
    assert completed(await h.run("w")).output == {"got": {"n": 1}}


async def test_buffered_signal_is_consumed_without_suspending(h: Harness) -> None:
    @h.wf.stage
    async def w(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go", timeout=timedelta(days=1))

    h.ledger.push("go", {"early": True})
    assert completed(await h.run("w")).output == {"early": True}
    assert h.ledger.signals == {}
    assert h.ledger.consumed == ["go"]
    assert h.ledger.records["go"].completed


async def test_wait_timeout_raises_step_timeout_error_that_the_body_can_handle(
    h: Harness,
) -> None:
    @h.wf.stage
    async def w(ctx: StageContext[In]) -> str:
        try:
            await ctx.step.wait_for_signal("go", timeout=timedelta(seconds=30))
        except StepTimeoutError:
            return "gave up"
        return "signalled"

    t0 = h.clock.now()
    assert suspended(await h.run("w")).until == t0 + timedelta(seconds=30)
    h.clock.advance(20)
    assert suspended(await h.run("w")).until == t0 + timedelta(seconds=30)  # no sliding
    h.clock.advance(10)
    assert completed(await h.run("w")).output == "gave up"


async def test_uncaught_wait_timeout_fails_retryable_and_the_deadline_stays_fixed(
    h: Harness,
) -> None:
    @h.wf.stage
    async def w(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go", timeout=timedelta(seconds=30))

    t0 = h.clock.now()
    suspended(await h.run("w"))
    h.clock.advance(31)
    f = failed(await h.run("w"))
    assert f.retryable
    assert f.error.type == "StepTimeoutError" and f.error.stage == "w"
    assert (t0 + timedelta(seconds=30)).isoformat() in f.error.message
    # the next attempt keeps the ledger, so the deadline is the original one
    h.clock.advance(3600)
    f2 = failed(await h.run("w", attempt=2))
    assert f2.error.type == "StepTimeoutError"
    assert (t0 + timedelta(seconds=30)).isoformat() in f2.error.message


async def test_a_timed_out_wait_stays_timed_out_when_the_signal_arrives_later(
    h: Harness,
) -> None:
    """Replay must be deterministic: once the body saw the timeout, a late signal must not
    change what the wait returns on the next replay."""

    @h.wf.stage
    async def w(ctx: StageContext[In]) -> str:
        try:
            got = await ctx.step.wait_for_signal("go", timeout=10)
            outcome = f"signal {got}"
        except StepTimeoutError:
            outcome = "timeout"
        await ctx.step.run("record", h.count, f"after {outcome}")
        await ctx.step.sleep("cool-down", 100)
        return outcome

    suspended(await h.run("w"))
    h.clock.advance(11)
    assert suspended(await h.run("w")).waiting_for == "sleep:cool-down"
    h.ledger.push("go", "late")
    h.clock.advance(100)
    assert completed(await h.run("w")).output == "timeout"
    assert h.counts == {"after timeout": 1}


async def test_signals_of_one_name_queue_and_each_wait_takes_the_next(h: Harness) -> None:
    """Waiting twice on one name in a stage: the second wait is journaled under ``go#2``, and
    the two waits take the queued signals oldest first."""

    @h.wf.stage
    async def w(ctx: StageContext[In]) -> list[Any]:
        first = await ctx.step.wait_for_signal("go")
        await ctx.step.run("between", h.count, "between")
        second = await ctx.step.wait_for_signal("go")
        third = await ctx.step.wait_for_signal("go")
        return [first, second, third]

    assert suspended(await h.run("w")).waiting_for == "signal:go"
    h.ledger.push("go", 1)
    h.ledger.push("go", 2)
    assert suspended(await h.run("w")).waiting_for == "signal:go"  # the third wait
    assert [r.name for r in h.ledger.written if r.completed] == ["go", "between", "go#2"]
    assert {n: (r.signal, r.result) for n, r in h.ledger.records.items() if r.kind == "signal"} == {
        "go": ("go", 1),
        "go#2": ("go", 2),
        "go#3": ("go", None),
    }
    h.ledger.push("go", 3)
    assert completed(await h.run("w")).output == [1, 2, 3]
    assert h.ledger.consumed == ["go", "go", "go"]
    assert h.counts == {"between": 1}
    # replay from the top: same keys, journaled payloads, nothing taken from the queue
    h.ledger.push("go", 4)
    assert completed(await h.run("w")).output == [1, 2, 3]
    assert h.ledger.signals == {"go": [4]}


async def test_signal_wait_keys_are_numbered_per_name_and_collide_loudly(h: Harness) -> None:
    @h.wf.stage
    async def w(ctx: StageContext[In]) -> list[Any]:
        a = await ctx.step.wait_for_signal("a")
        b = await ctx.step.wait_for_signal("b")
        a2 = await ctx.step.wait_for_signal("a")
        return [a, b, a2]

    @h.wf.stage
    async def clash(ctx: StageContext[In]) -> Any:
        await ctx.step.run("go#2", h.count, "x")
        await ctx.step.wait_for_signal("go")
        return await ctx.step.wait_for_signal("go")

    for name, payload in (("a", 1), ("b", 2), ("a", 3)):
        h.ledger.push(name, payload)
    assert completed(await h.run("w")).output == [1, 2, 3]
    assert sorted(h.ledger.records) == ["a", "a#2", "b"]
    h.ledger.push("go", 1)
    f = failed(await h.run("clash"))
    assert f.error.type == "StepError" and "go#2" in f.error.message and not f.retryable


# -- polling ---------------------------------------------------------------------------------


async def test_wait_for_polls_until_the_check_returns_a_value(h: Harness) -> None:
    ready: dict[str, Any] = {"value": None}

    def check() -> Any:
        h.count("check")
        return ready["value"]

    @h.wf.stage
    async def p(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for("ready", check, interval=timedelta(seconds=5))

    t0 = h.clock.now()
    s = suspended(await h.run("p"))
    assert (s.reason, s.until, s.waiting_for) == ("poll", t0 + timedelta(seconds=5), "poll:ready")
    h.clock.advance(5)
    ready["value"] = False  # False also means "not yet"
    assert suspended(await h.run("p")).until == t0 + timedelta(seconds=10)
    h.clock.advance(5)
    ready["value"] = {"ok": 1}
    assert completed(await h.run("p")).output == {"ok": 1}
    assert h.counts["check"] == 3
    ready["value"] = None
    assert completed(await h.run("p")).output == {"ok": 1}  # journaled, no re-check
    assert h.counts["check"] == 3


async def test_wait_for_timeout_caps_the_poll_and_raises_step_timeout_error(h: Harness) -> None:
    @h.wf.stage
    async def p(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for("never", lambda: None, interval=60, timeout=90)

    t0 = h.clock.now()
    assert suspended(await h.run("p")).until == t0 + timedelta(seconds=60)
    h.clock.advance(60)
    assert suspended(await h.run("p")).until == t0 + timedelta(seconds=90)
    h.clock.advance(30)
    f = failed(await h.run("p"))
    assert f.error.type == "StepTimeoutError" and f.retryable


# -- failures --------------------------------------------------------------------------------


async def test_step_name_used_twice_fails_not_retryable(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> int:
        await ctx.step.run("x", h.count, "x")
        await ctx.step.run("x", h.count, "x")
        return 1

    f = failed(await h.run("s"))
    assert f.error.type == "StepError" and not f.retryable
    assert "'x'" in f.error.message and "twice" in f.error.message


async def test_non_json_step_result_fails_with_serialization_error_naming_the_step(
    h: Harness,
) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> Any:
        return await ctx.step.run("make-object", object)

    f = failed(await h.run("s"))
    assert f.error.type == "SerializationError" and not f.retryable
    assert "make-object" in f.error.message
    assert "make-object" not in h.ledger.records


async def test_nan_step_result_is_not_json(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> Any:
        return await ctx.step.run("nan", lambda: {"x": [1.0, float("nan")]})

    f = failed(await h.run("s"))
    assert f.error.type == "SerializationError" and not f.retryable
    assert "nan" in f.error.message


async def test_non_json_stage_output_fails_with_serialization_error(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> Any:
        return {"when": threading.Lock()}

    f = failed(await h.run("s"))
    assert f.error.type == "SerializationError" and not f.retryable
    assert "'s'" in f.error.message


async def test_event_data_over_max_payload_bytes_is_refused_by_emit_and_not_retried(
    h: Harness,
) -> None:
    """One event's data is bounded as a step result is (its canonical JSON): exactly the
    limit is staged, a byte more raises PayloadTooLargeError at the emit (a body catching
    it goes on without the event); uncaught, the attempt fails, not retryable."""
    h.runner.max_payload_bytes = 100
    pad = 100 - len('{"p":""}')
    refused: list[str] = []

    @h.wf.stage
    async def s(ctx: StageContext[In]) -> str:
        ctx.emit("fits", {"p": "x" * pad})
        try:
            ctx.emit("caught", {"p": "x" * (pad + 1)})
        except PayloadTooLargeError as exc:
            refused.append(str(exc))
        ctx.emit("over", "x" * 200)
        return "unreachable"

    f = failed(await h.run("s"))
    assert f.error.type == "PayloadTooLargeError" and not f.retryable
    assert "data of event 'over'" in f.error.message and "max_payload_bytes" in f.error.message
    assert len(refused) == 1 and "data of event 'caught'" in refused[0]


async def test_stage_output_not_matching_its_annotation_is_a_serialization_error(
    h: Harness,
) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> Out:
        return {"value": "not a number"}  # type: ignore[return-value]

    f = failed(await h.run("s"))
    assert f.error.type == "SerializationError" and not f.retryable


async def test_stage_output_is_plain_json(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> Out:
        return Out(value=ctx.input.n, label="seven")

    assert completed(await h.run("s")).output == {"value": 7, "label": "seven"}


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (NonRetryableError("stop"), False),
        (Fatal("listed"), False),
        (FatalChild("subclass of listed"), False),
        (Flaky("other"), True),
        (KeyError("other"), True),
        (StepTimeoutError("uncaught wait timeout"), True),
    ],
)
async def test_retryable_follows_the_retry_policy(
    h: Harness, error: Exception, retryable: bool
) -> None:
    @h.wf.stage(retry=Retry(non_retryable=(Fatal,)))
    async def s(ctx: StageContext[In]) -> None:
        raise error

    f = failed(await h.run("s"))
    assert f.retryable is retryable
    assert f.error.type == type(error).__name__
    assert f.error.stage == "s"


async def test_stage_timeout_fails_retryable_with_stage_timeout_error(h: Harness) -> None:
    never = asyncio.Event()

    @h.wf.stage(timeout=timedelta(milliseconds=50))
    async def slow(ctx: StageContext[In]) -> None:
        await never.wait()

    f = failed(await h.run("slow"))
    assert f.error.type == "StageTimeoutError" and f.retryable
    assert "timeout" in f.error.message


async def test_a_timeout_error_raised_by_the_body_is_not_a_stage_timeout(h: Harness) -> None:
    @h.wf.stage(timeout=timedelta(minutes=1))
    async def s(ctx: StageContext[In]) -> None:
        raise TimeoutError("upstream service timed out")

    f = failed(await h.run("s"))
    assert f.error.type == "TimeoutError" and f.retryable


async def test_invalid_input_fails_the_stage_without_retry(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> None:
        h.count("body")

    f = failed(await h.run("s", input={"n": "not an int"}))
    assert f.error.type == "InvalidInputError" and not f.retryable
    assert "n" in f.error.message
    assert h.counts["body"] == 0


# -- sync bodies -----------------------------------------------------------------------------


async def test_sync_stage_body_runs_in_a_thread_and_uses_sync_step(h: Harness) -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    @h.wf.stage
    def s(ctx: StageContext[In]) -> int:
        threads.append(threading.get_ident())
        x = ctx.sync_step.run("x", h.count, "x", 10)
        ctx.sync_step.sleep("nap", 60)
        return int(x) + ctx.input.n

    suspended(await h.run("s"))
    h.clock.advance(60)
    assert completed(await h.run("s")).output == 17
    assert h.counts["x"] == 1
    assert threads and all(t != loop_thread for t in threads)


async def test_sync_stage_body_can_wait_for_a_signal(h: Harness) -> None:
    @h.wf.stage
    def s(ctx: StageContext[In]) -> Any:
        return ctx.sync_step.wait_for_signal("go")

    assert suspended(await h.run("s")).waiting_for == "signal:go"
    h.ledger.push("go", [1, 2])
    assert completed(await h.run("s")).output == [1, 2]


@pytest.mark.timeout(15)  # the bug this guards against is a hang of the event loop
async def test_sync_step_in_an_async_body_fails_instead_of_deadlocking(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> Any:
        return ctx.sync_step.run("x", h.count, "x")

    f = await asyncio.wait_for(h.run("s"), timeout=10)
    f = failed(f)
    assert f.error.type == "StepError" and not f.retryable
    assert h.counts["x"] == 0


# -- context ---------------------------------------------------------------------------------


async def test_output_of_returns_the_typed_upstream_output(h: Harness) -> None:
    @h.wf.stage
    async def a(ctx: StageContext[In]) -> Out:
        return Out(value=1, label="from a")

    @h.wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> str:
        up = ctx.output_of(a)
        assert isinstance(up, Out)
        assert ctx.output_of("a") == up
        return f"{up.label}:{up.value}"

    a_out = completed(await h.run("a")).output
    assert completed(await h.run("b", outputs={"a": a_out})).output == "from a:1"


async def test_output_of_a_stage_that_has_no_output_fails_not_retryable(h: Harness) -> None:
    @h.wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return ctx.output_of("b")  # type: ignore[no-any-return]

    @h.wf.stage
    async def b(ctx: StageContext[In]) -> int:
        return 1

    f = failed(await h.run("a"))
    assert f.error.type == "StepError" and not f.retryable


async def test_context_carries_run_stage_attempt_and_input(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> list[Any]:
        assert isinstance(ctx.input, In)
        return [ctx.run_id, ctx.stage_id, ctx.attempt, ctx.input.n, ctx.workflow_id]

    out = completed(await h.run("s", attempt=3)).output
    assert out == ["run-1", "s", 3, 7, "wf"]


async def test_emit_collects_business_events_once_per_completed_execution(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> None:
        ctx.emit("order.reserved", {"order": 1})
        await ctx.step.sleep("nap", 1)
        ctx.emit("order.charged", Out(value=2))
        ctx.emit("order.note", "plain")
        ctx.emit("order.empty")

    s1 = suspended(await h.run("s"))
    assert s1.reason == "sleep"
    h.clock.advance(1)
    done = completed(await h.run("s"))
    assert [(e.type, e.data) for e in done.events] == [
        ("order.reserved", {"order": 1}),
        ("order.charged", {"value": 2, "label": ""}),
        ("order.note", {"value": "plain"}),
        ("order.empty", {}),
    ]


async def test_emit_with_non_json_data_fails_not_retryable(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> None:
        ctx.emit("bad", {"x": object()})

    f = failed(await h.run("s"))
    assert f.error.type == "SerializationError" and not f.retryable


# -- hooks -----------------------------------------------------------------------------------


async def test_hook_runs_handlers_once_across_a_replay_in_registration_order() -> None:
    h = Harness(hooks=("order.charged",))

    async def audit(ctx: StageContext[Any], payload: Any) -> str:
        h.count("audit")
        return f"audit {payload['id']}"

    def notify(ctx: StageContext[Any], payload: Any) -> dict[str, Any]:
        h.count("notify")
        return {"notified": payload["id"], "stage": ctx.stage_id}

    h.registry.register_hook("order.charged", audit)
    h.registry.register_hook("order.charged", notify)

    @h.wf.stage
    async def charge(ctx: StageContext[In]) -> list[Any]:
        results = await ctx.hook("order.charged", {"id": 9})
        await ctx.step.sleep("settle", 5)
        return results

    suspended(await h.run("charge"))
    h.clock.advance(5)
    assert completed(await h.run("charge")).output == [
        "audit 9",
        {"notified": 9, "stage": "charge"},
    ]
    assert h.counts == {"audit": 1, "notify": 1}


async def test_hook_called_twice_runs_the_handlers_twice() -> None:
    h = Harness(hooks=("tick",))
    h.registry.register_hook("tick", lambda ctx, p: h.count("tick", p), name="tick")

    @h.wf.stage
    async def s(ctx: StageContext[In]) -> list[Any]:
        return [*(await ctx.hook("tick", 1)), *(await ctx.hook("tick", 2))]

    assert completed(await h.run("s")).output == [1, 2]
    assert h.counts["tick"] == 2


async def test_hook_without_handlers_returns_an_empty_list() -> None:
    h = Harness(hooks=("order.charged",))

    @h.wf.stage
    async def s(ctx: StageContext[In]) -> list[Any]:
        return await ctx.hook("order.charged", {"id": 1})

    assert completed(await h.run("s")).output == []


async def test_hook_that_is_not_declared_fails_with_step_error(h: Harness) -> None:
    h.registry.register_hook("undeclared", lambda ctx, p: h.count("handler"), name="x")

    @h.wf.stage
    async def s(ctx: StageContext[In]) -> list[Any]:
        return await ctx.hook("undeclared")

    f = failed(await h.run("s"))
    assert f.error.type == "StepError" and not f.retryable
    assert "undeclared" in f.error.message
    assert h.counts["handler"] == 0


async def test_hook_sync_from_a_sync_body() -> None:
    h = Harness(hooks=("order.charged",))
    h.registry.register_hook("order.charged", lambda ctx, p: p * 2, name="double")

    @h.wf.stage
    def s(ctx: StageContext[In]) -> list[Any]:
        return ctx.hook_sync("order.charged", 21)

    assert completed(await h.run("s")).output == [42]


# -- compensation ----------------------------------------------------------------------------


async def test_compensate_calls_the_compensation_with_the_typed_output(h: Harness) -> None:
    got: list[Any] = []

    @h.wf.stage
    async def reserve(ctx: StageContext[In]) -> Out:
        return Out(value=5, label="seat")

    @reserve.compensation
    async def release(ctx: StageContext[In], output: Out) -> None:
        got.append((output, ctx.stage_id, ctx.input.n))

    output = completed(await h.run("reserve")).output
    res = await h.runner.compensate(h.request("reserve"), output, InMemoryLedger())
    assert completed(res).output is None
    assert got == [(Out(value=5, label="seat"), "reserve", 7)]


async def test_compensate_of_a_stage_without_compensation_is_a_no_op(h: Harness) -> None:
    @h.wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    assert completed(await h.runner.compensate(h.request("a"), 1, h.ledger)).output is None


async def test_failing_compensation_is_failed_and_follows_the_retry_policy(h: Harness) -> None:
    @h.wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @a.compensation
    def undo(ctx: StageContext[In], output: int) -> None:
        raise Flaky("cannot undo yet")

    @h.wf.stage
    async def b(ctx: StageContext[In]) -> int:
        return 1

    @b.compensation
    async def undo_b(ctx: StageContext[In], output: int) -> None:
        raise NonRetryableError("gone")

    fa = failed(await h.runner.compensate(h.request("a"), 1, h.ledger))
    assert fa.retryable and fa.error.type == "Flaky"
    fb = failed(await h.runner.compensate(h.request("b"), 1, h.ledger))
    assert not fb.retryable and fb.error.message == "gone"


async def test_compensation_steps_are_durable(h: Harness) -> None:
    @h.wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @a.compensation
    async def undo(ctx: StageContext[In], output: int) -> None:
        await ctx.step.run("refund", h.count, "refund")
        if h.counts["refund"] == 1 and h.counts["raised"] == 0:
            h.count("raised")
            raise Flaky("after the refund")

    failed(await h.runner.compensate(h.request("a"), 1, h.ledger))
    completed(await h.runner.compensate(h.request("a"), 1, h.ledger))
    assert h.counts["refund"] == 1


# -- cancellation ----------------------------------------------------------------------------


async def test_cancelling_the_task_running_the_stage_propagates_cancelled_error(
    h: Harness,
) -> None:
    started = asyncio.Event()
    never = asyncio.Event()
    cleaned: list[bool] = []

    @h.wf.stage
    async def s(ctx: StageContext[In]) -> None:
        started.set()
        try:
            await never.wait()
        finally:
            cleaned.append(True)

    task = asyncio.create_task(h.run("s"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]


async def test_ctx_cancelled_reflects_the_cancel_event(h: Harness) -> None:
    cancel = asyncio.Event()
    started = asyncio.Event()
    seen: list[bool] = []

    @h.wf.stage
    async def s(ctx: StageContext[In]) -> bool:
        seen.append(ctx.cancelled)
        started.set()
        await cancel.wait()
        return ctx.cancelled

    task = asyncio.create_task(h.run("s", cancel_event=cancel))
    await started.wait()
    assert seen == [False]
    cancel.set()
    assert completed(await task).output is True


async def test_ctx_cancelled_is_false_without_a_cancel_event(h: Harness) -> None:
    @h.wf.stage
    async def s(ctx: StageContext[In]) -> bool:
        return ctx.cancelled

    assert completed(await h.run("s")).output is False


async def test_a_body_that_ignores_cancellation_is_left_behind_after_the_grace(
    h: Harness,
) -> None:
    """A stage body that swallows CancelledError cannot hold the engine: after the grace the
    runner stops waiting for it and the cancellation goes on."""
    h.runner.cancel_grace = 0.1
    started = asyncio.Event()
    release = asyncio.Event()

    @h.wf.stage
    async def s(ctx: StageContext[In]) -> int:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # ignores the cancel until the test lets it go
        return 1

    task = asyncio.create_task(h.run("s"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    release.set()  # let the orphaned body finish so the loop closes cleanly
    await asyncio.sleep(0)


async def test_a_body_that_returns_after_its_cancel_within_the_grace_has_returned(
    h: Harness,
) -> None:
    started = asyncio.Event()

    @h.wf.stage
    async def s(ctx: StageContext[In]) -> str:
        started.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        return "booked"

    task = asyncio.create_task(h.run("s"))
    await started.wait()
    task.cancel()
    assert completed(await task).output == "booked"


async def test_a_new_signal_wait_suspends_once_even_if_its_deadline_passed_meanwhile(
    h: Harness,
) -> None:
    """A slow ledger write on a busy machine must not change the trace: a wait with no signal
    suspends on its first execution, and times out on the replay (found by the fuzzer)."""
    clock = h.clock
    put = h.ledger.put

    async def slow_put(rec: Any) -> None:
        await put(rec)
        clock.advance(5)  # the write took longer than the wait's timeout

    h.ledger.put = slow_put  # type: ignore[method-assign]

    @h.wf.stage
    async def s(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go", timeout=1)

    first = suspended(await h.run("s"))
    assert first.waiting_for == "signal:go"
    assert "StepTimeoutError" in failed(await h.run("s")).error.type


# -- durations a body can get wrong ------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda s: s.sleep("z", float("inf")), "finite number of seconds, got inf"),
        (lambda s: s.sleep("z", float("nan")), "got nan"),
        (lambda s: s.sleep("z", "5"), "got '5'"),
        (lambda s: s.sleep("z", True), "got True"),
        (lambda s: s.sleep("z", 1e20), "after the year 9999"),
        (lambda s: s.sleep("z", timedelta.max), "after the year 9999"),
        (lambda s: s.wait_for_signal("q", timeout=float("inf")), "timeout must be"),
        (lambda s: s.wait_for_signal("q", timeout="1"), "got '1'"),
        (lambda s: s.wait_for("w", lambda: None, timeout=float("nan")), "timeout must be"),
        (lambda s: s.wait_for("w", lambda: True, interval=0), "more than 0 seconds"),
        (lambda s: s.wait_for("w", lambda: True, interval=float("nan")), "got nan"),
    ],
)
async def test_a_duration_that_is_not_one_fails_the_step_before_anything_is_journaled(
    h: Harness, call: Any, says: str
) -> None:
    """NaN, infinity and a time past the year 9999 were a ValueError or OverflowError from
    inside the step (retried as the body's own error), text was read as seconds, and a poll
    interval of 0 (or NaN, with a check that is met at once) was taken."""

    @h.wf.stage
    async def p(ctx: StageContext[In]) -> Any:
        return await call(ctx.step)

    f = failed(await h.run("p"))
    assert f.error.type == "StepError" and says in f.error.message and not f.retryable
    assert h.ledger.written == []


async def test_a_negative_sleep_or_signal_timeout_has_already_passed(h: Harness) -> None:
    @h.wf.stage
    async def p(ctx: StageContext[In]) -> Any:
        await ctx.step.sleep("z", -5)
        return await ctx.step.wait_for_signal("q", timeout=timedelta(seconds=-1))

    assert suspended(await h.run("p")).reason == "signal"  # (a new wait suspends once)
    f = failed(await h.run("p"))
    assert f.error.type == "StepTimeoutError"


async def test_a_wait_for_a_signal_the_workflow_does_not_declare_fails_at_once(h: Harness) -> None:
    """Once a workflow declares its signals, engine.signal refuses any other name, so a wait
    for one (a typo: "aproval") waited until its timeout, or for ever."""

    @h.wf.stage(signals=["approval"])
    async def p(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("approval")

    @h.wf.stage(after=[p])
    async def q(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("aproval")

    assert suspended(await h.run("p")).waiting_for == "signal:approval"
    f = failed(await h.run("q"))
    assert f.error.type == "StepError" and not f.retryable
    assert "'aproval', which no stage of its workflow declares (declared: approval)" in (
        f.error.message
    )
    assert [r.name for r in h.ledger.written] == ["approval"]


async def test_a_workflow_that_declares_no_signals_waits_for_any_name(h: Harness) -> None:
    @h.wf.stage
    async def p(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("anything")

    assert suspended(await h.run("p")).waiting_for == "signal:anything"


async def test_a_stage_after_a_signal_suspends_before_its_body_and_journals_nothing(
    h: Harness,
) -> None:
    @h.wf.stage(after_signal="go")
    async def p(ctx: StageContext[In]) -> Any:
        h.count("body")
        first = await ctx.step.wait_for_signal("go")
        again = await ctx.step.wait_for_signal("go")  # the body's second wait is its own
        return [first, again]

    assert suspended(await h.run("p")).waiting_for == "signal:go"
    assert h.counts["body"] == 0 and h.ledger.written == []
    h.ledger.signals["go"] = [{"n": 1}]
    assert suspended(await h.run("p")).waiting_for == "signal:go"  # the body's own wait
    assert h.counts["body"] == 1
    assert [(r.name, r.completed) for r in h.ledger.written] == [("go", True), ("go#2", False)]
    h.ledger.signals["go"] = [{"n": 2}]
    assert completed(await h.run("p", attempt=2)).output == [{"n": 1}, {"n": 2}]
    assert h.ledger.consumed == ["go", "go"]


async def test_a_stage_after_a_signal_with_a_timeout_fails_at_its_deadline_without_its_body(
    h: Harness,
) -> None:
    @h.wf.stage(after_signal="go", after_signal_timeout=timedelta(minutes=5))
    async def p(ctx: StageContext[In]) -> Any:
        h.count("body")
        return await ctx.step.wait_for_signal("go")

    t0 = h.clock.now()
    first = suspended(await h.run("p"))
    assert (first.waiting_for, first.until) == ("signal:go", t0 + timedelta(minutes=5))
    # the deadline is journaled at the first wait, so it never slides
    assert [(r.name, r.completed, r.deadline) for r in h.ledger.written] == [
        ("go", False, t0 + timedelta(minutes=5))
    ]
    h.clock.advance(timedelta(minutes=4))
    assert suspended(await h.run("p")).until == t0 + timedelta(minutes=5)
    h.clock.advance(timedelta(minutes=1))
    f = failed(await h.run("p"))
    assert f.error.type == "StepTimeoutError" and f.retryable
    assert "no signal 'go' arrived before" in f.error.message
    assert h.counts["body"] == 0
    h.ledger.signals["go"] = [{"late": True}]  # too late: the journaled timeout stands
    assert failed(await h.run("p", attempt=2)).error.type == "StepTimeoutError"
    assert h.counts["body"] == 0 and h.ledger.consumed == []


async def test_a_stage_after_a_signal_with_a_timeout_runs_on_a_signal_in_time(h: Harness) -> None:
    @h.wf.stage(after_signal="go", after_signal_timeout=timedelta(minutes=5))
    async def p(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    suspended(await h.run("p"))
    h.clock.advance(timedelta(minutes=4))
    h.ledger.signals["go"] = [{"n": 1}]
    assert completed(await h.run("p")).output == {"n": 1}


def test_after_signal_timeout_needs_after_signal() -> None:
    from engine_port.errors import DefinitionError

    wf = Workflow("gate-timeout", input=In)
    with pytest.raises(DefinitionError, match="bounds the wait of after_signal="):
        wf.stage(after_signal_timeout=timedelta(seconds=1))
    with pytest.raises(DefinitionError, match="after_signal_timeout=: timeout must be a posi"):

        @wf.stage(after_signal="go", after_signal_timeout=5)  # type: ignore[arg-type]
        async def q(ctx: StageContext[In]) -> int:
            return 1

    @wf.stage(after_signal="go", after_signal_timeout=timedelta(seconds=90))
    async def p(ctx: StageContext[In]) -> int:
        return 1

    assert wf.graph().stage("p").after_signal_timeout_s == 90.0


def test_after_signal_declares_the_signal() -> None:
    from engine_port._signal_names import check_signal_known
    from engine_port.errors import DefinitionError, UnknownSignalError

    wf = Workflow("gate-decl", input=In)

    @wf.stage(signals=["other"], after_signal="go")
    async def p(ctx: StageContext[In]) -> int:
        return 1

    g = wf.graph()
    assert g.stage("p").signals == ["go", "other"] and g.stage("p").after_signal == "go"
    check_signal_known(g, "r1", "go")
    with pytest.raises(UnknownSignalError):
        check_signal_known(g, "r1", "og")
    with pytest.raises(DefinitionError, match="after_signal= takes one signal name"):
        wf.stage(after_signal=["go"])  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="signal name"):
        wf.stage(after_signal="")
