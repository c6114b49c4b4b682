"""What user code hands the engine and what it gets back, the same on native SQLite, native
PostgreSQL and Temporal (DESIGN §5: both drivers behave identically; every error a user can
cause is a typed EngineError).

Covered elsewhere, not repeated here: names and NUL/surrogate/NaN/deep values refused by the
public calls and inside a stage (tests/security/test_input_limits.py), numbers past 64 bits,
-0.0 and forged ``$wfe_spill`` references (conformance/_hostile.py), a step result of exactly
``spill_threshold_bytes`` (conformance/_blindspots.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import decimal
import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from engine_port import (
    ClaimCheck,
    EngineSettings,
    MemoryBlobStore,
    MemorySink,
    Registry,
    Retry,
    RunStatus,
    StageContext,
    Workflow,
    WorkflowEngine,
    create_engine,
)
from engine_port._serde import dumps
from engine_port.errors import InvalidInputError

HUGE = 10**4300  # 4,301 digits: past what Python's int/str conversion (json, SQLAlchemy) reads


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    case: str = ""


class Model(BaseModel):
    z: int = 1
    a: str = "x"


@dataclasses.dataclass
class Data:
    z: int = 1
    when: datetime = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)


# -- engines -----------------------------------------------------------------------------------

Factory = Callable[..., AbstractAsyncContextManager[WorkflowEngine]]


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("temporal", marks=pytest.mark.temporal),
    ]
)
def engine_of(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    """``engine_of(workflows, **settings)``: a connected engine of the driver with a worker
    running, on a fresh database (task queue)."""
    base: dict[str, Any] = {"blob_url": f"file://{tmp_path / 'blobs'}"}
    if request.param == "sqlite":
        base["database_url"] = f"sqlite:///{tmp_path / 'wfe.db'}"
    elif request.param == "postgres":
        base["database_url"] = request.getfixturevalue("pg_session").new_schema()
    else:
        server = request.getfixturevalue("temporal_server")
        base["driver"] = "temporal"
        base["temporal_address"] = server.address
        base["task_queue"] = f"values-{uuid.uuid4().hex[:10]}"

    @asynccontextmanager
    async def factory(
        workflows: list[Workflow[Any]], store: Any = None, **more: Any
    ) -> AsyncIterator[WorkflowEngine]:
        engine = create_engine(
            EngineSettings(**base, **more),
            Registry(workflows),
            event_sink=MemorySink(),
            blob_store=store,
        )
        async with engine, engine.worker():
            yield engine

    return factory


def _same(got: Any, want: Any) -> bool:
    """Equal as JSON text, key order and the type of every number included (``-0.0 == 0``,
    ``1 == 1.0`` and dicts in any key order compare equal in Python)."""
    return json.dumps(got) == json.dumps(want)


# -- 1. values a stage body and a step return ---------------------------------------------------

RETURNED: dict[str, tuple[Any, Any]] = {
    # case: (what user code returns, what every later reader gets)
    "tuple": ((1, "a", (2.5, None)), [1, "a", [2.5, None]]),
    "int keys": ({2: "b", 1: "a"}, {"2": "b", "1": "a"}),
    "set": ({7}, [7]),
    "bytes": (b"abc", "abc"),
    "datetime": (
        datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        "2024-01-02T03:04:05.000006Z",
    ),
    "naive datetime": (datetime(2024, 1, 2, 3, 4, 5), "2024-01-02T03:04:05"),
    "timedelta": (timedelta(minutes=90), "PT1H30M"),
    "decimal": (decimal.Decimal("1.10"), "1.10"),
    "-0.0": (-0.0, -0.0),
    "float that reads as an int": (1e16, 1e16),
    "past 64 bits": (2**64 + 3, 2**64 + 3),
    "pydantic model": (Model(), {"z": 1, "a": "x"}),
    "dataclass": (Data(), {"z": 1, "when": "2024-01-02T03:04:05Z"}),
    # the keys in the order the user gave them (Temporal's JSON converter sorted them)
    "key order": ({"b": 1, "a": {"z": 2, "y": 3}, "B": 4}, {"b": 1, "a": {"z": 2, "y": 3}, "B": 4}),
}


def _returning() -> Workflow[Loose]:
    wf = Workflow(f"returns-{uuid.uuid4().hex[:6]}", input=Loose)

    @wf.stage
    async def produce(ctx: StageContext[Loose]) -> Any:
        value = RETURNED[ctx.input.case][0]
        step = await ctx.step.run("step", lambda: value)
        return {"step": step, "out": value}

    @wf.stage(after=[produce])
    async def consume(ctx: StageContext[Loose]) -> Any:
        return ctx.output_of(produce)

    return wf


async def test_values_user_code_returns_come_back_as_the_same_json_on_every_driver(
    engine_of: Factory,
) -> None:
    wf = _returning()
    async with engine_of([wf]) as engine:
        runs = {case: await engine.start(wf.id, {"case": case}) for case in RETURNED}
        for case, run in runs.items():
            info = await engine.wait(run.id, timeout=60)
            assert info.status == RunStatus.COMPLETED, (case, info.error)
            want = RETURNED[case][1]
            # the next stage, the stored output and the run's output: the value as JSON
            assert _same(info.stage("produce").output, {"step": want, "out": want}), case
            assert _same(info.output, {"step": want, "out": want}), case
            assert _same((await engine.get_run(run.id)).output, info.output), case
            assert [(s.stage, s.name, s.completed) for s in await engine.steps(run.id)] == [
                ("produce", "step", True)
            ]


# -- values no backend can store ----------------------------------------------------------------

calls: dict[str, int] = {}

UNSTORABLE: dict[str, tuple[str, Any, str, str]] = {
    # case: (where, value, error type, words in the message)
    "huge int step": ("step", HUGE, "InvalidInputError", "integer of more than 4300 digits"),
    "huge int output": ("output", [HUGE], "InvalidInputError", "at $[0] is an integer of more"),
    "nan output": ("output", {"x": float("nan")}, "SerializationError", "contains nan"),
    "inf step": ("step", float("-inf"), "SerializationError", "contains -inf"),
    "surrogate output": ("output", "a\ud800", "InvalidInputError", "lone surrogate"),
    "nul step": ("step", {"k": "a\x00"}, "InvalidInputError", "NUL character"),
    "bad bytes output": ("output", b"\xff", "SerializationError", "is not JSON-serialisable"),
    "colliding keys": ("output", {1: "a", "1": "b"}, "SerializationError", "both '1' in JSON"),
}


def _unstorable() -> Workflow[Loose]:
    wf = Workflow(f"unstorable-{uuid.uuid4().hex[:6]}", input=Loose)

    @wf.stage(retry=Retry(max_attempts=3, initial_interval=timedelta(milliseconds=10)))
    async def make(ctx: StageContext[Loose]) -> Any:
        where, value, _, _ = UNSTORABLE[ctx.input.case]
        calls[ctx.input.case] = calls.get(ctx.input.case, 0) + 1
        if where == "step":
            return await ctx.step.run("s", lambda: value)
        return value

    return wf


async def test_a_value_no_backend_can_store_fails_the_stage_once_with_a_typed_error(
    engine_of: Factory,
) -> None:
    """A 4,301-digit integer was journaled through ``json.dumps`` and raised its ValueError
    from inside SQLAlchemy: a DBAPIError (SQLite) or StatementError (PostgreSQL) retried
    until the attempts ran out, and on Temporal a run that never ended."""
    calls.clear()
    wf = _unstorable()
    async with engine_of([wf]) as engine:
        runs = {case: await engine.start(wf.id, {"case": case}) for case in UNSTORABLE}
        for case, run in runs.items():
            info = await engine.wait(run.id, timeout=30)
            _, _, error, words = UNSTORABLE[case]
            assert info.status == RunStatus.FAILED, case
            assert info.error is not None
            assert (info.error.type, info.stages[0].attempt) == (error, 1), (case, info.error)
            assert words in info.error.message, case
            assert calls[case] == 1, case
            assert await engine.steps(run.id) == [], case


# -- 2. run inputs and signal payloads ----------------------------------------------------------


def _echo() -> Workflow[Loose]:
    wf = Workflow(f"echo-{uuid.uuid4().hex[:6]}", input=Loose)

    @wf.stage
    async def echo(ctx: StageContext[Loose]) -> Any:
        return {"input": ctx.input.model_dump(), "signal": await ctx.step.wait_for_signal("go")}

    return wf


async def test_inputs_and_signal_payloads_come_back_as_the_same_json_on_every_driver(
    engine_of: Factory,
) -> None:
    wf = _echo()
    async with engine_of([wf]) as engine:
        runs = {}
        for case, (given, _) in RETURNED.items():
            runs[case] = run = await engine.start(wf.id, {"case": case, "x": given})
            await engine.signal(run.id, "go", given)
        for case, run in runs.items():
            want = RETURNED[case][1]
            info = await engine.wait(run.id, timeout=60)
            assert info.status == RunStatus.COMPLETED, (case, info.error)
            assert _same(info.input, {"case": case, "x": want}), case
            assert _same(info.output, {"input": {"case": case, "x": want}, "signal": want}), case


async def test_a_huge_integer_as_input_or_signal_payload_is_an_invalid_input(
    engine_of: Factory,
) -> None:
    """The start raised a bare ValueError (fingerprinting the input); the signal a bare
    ValueError (SQLite, Temporal) or a StatementError carrying the SQL text (PostgreSQL)."""
    wf = _echo()
    async with engine_of([wf]) as engine:
        with pytest.raises(InvalidInputError, match="integer of more than 4300 digits") as err:
            await engine.start(wf.id, {"x": [HUGE]})
        assert err.value.fields == ("input",)
        run = await engine.start(wf.id, {})
        with pytest.raises(InvalidInputError, match="integer of more than 4300 digits") as err:
            await engine.signal(run.id, "go", {"n": -HUGE})
        assert err.value.fields == ("signal payload",)
        assert "SQL" not in str(err.value)
        await engine.signal(run.id, "go", 1)
        info = await engine.wait(run.id, timeout=60)
    assert info.output == {"input": {"case": ""}, "signal": 1}


# -- exceptions a body raises -------------------------------------------------------------------


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("holds a lock", threading.Lock())

    def __str__(self) -> str:
        return "holds a lock"


class StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


class NotAnException(BaseException):
    pass


RAISED: dict[str, tuple[Callable[[], BaseException], str, str]] = {
    # case: (what the body raises, the error type recorded, its message)
    "unpicklable args": (Unpicklable, "Unpicklable", "holds a lock"),
    "__str__ raises": (StrRaises, "StrRaises", "<StrRaises: str() raised RuntimeError>"),
    "BaseException": (lambda: NotAnException("based"), "NotAnException", "based"),
    "no args": (ValueError, "ValueError", ""),
    "NUL": (lambda: ValueError("a\x00b"), "ValueError", "a\x00b"),
    # a lone surrogate is written as its escape: Temporal could not encode the failure (the
    # run never ended), and a native RunInfo could not be dumped as JSON
    "lone surrogate": (lambda: ValueError("bad \ud800 byte"), "ValueError", "bad \\ud800 byte"),
    "long": (
        lambda: ValueError("m" * 100_000),
        "ValueError",
        "m" * 8192 + "... (91,808 more characters cut)",
    ),
}


def _raising() -> Workflow[Loose]:
    wf = Workflow(f"raises-{uuid.uuid4().hex[:6]}", input=Loose)

    @wf.stage(retry=Retry(max_attempts=1))
    async def body(ctx: StageContext[Loose]) -> Any:
        if ctx.input.case.startswith("step "):

            def fail() -> None:
                raise RAISED[ctx.input.case[5:]][0]()

            return await ctx.step.run("fails", fail)
        raise RAISED[ctx.input.case][0]()

    return wf


async def test_what_a_body_raises_is_recorded_the_same_on_every_driver(
    engine_of: Factory,
) -> None:
    wf = _raising()
    cases = [*RAISED, *(f"step {c}" for c in RAISED)]
    async with engine_of([wf]) as engine:
        runs = {case: await engine.start(wf.id, {"case": case}) for case in cases}
        for case, run in runs.items():
            info = await engine.wait(run.id, timeout=30)
            _, error, message = RAISED[case.removeprefix("step ")]
            assert info.status == RunStatus.FAILED, case
            assert info.error is not None
            assert (info.error.type, info.error.message) == (error, message), case
            assert info.error.traceback and "\ud800" not in info.error.traceback, case
            assert info.model_dump_json()  # every record can be written as JSON


# -- values handed to user code are its own -----------------------------------------------------


def _mutating() -> Workflow[Loose]:
    wf = Workflow(f"mutates-{uuid.uuid4().hex[:6]}", input=Loose)

    @wf.stage
    async def first(ctx: StageContext[Loose]) -> Any:
        return {"n": [1]}

    @wf.stage(after=[first])
    async def changes(ctx: StageContext[Loose]) -> Any:
        ctx.output_of(first)["n"].append("changed")
        ctx.input.x["n"].append("changed")  # type: ignore[attr-defined]
        return None

    @wf.stage(after=[first])
    async def reads(ctx: StageContext[Loose]) -> Any:
        await asyncio.sleep(0.3)  # (after its sibling changed what it got)
        return [ctx.output_of(first), ctx.input.x]  # type: ignore[attr-defined]

    @wf.stage(after=[changes, reads])
    async def replays(ctx: StageContext[Loose]) -> Any:
        step = await ctx.step.run("step", lambda: {"k": [1]})
        signal = await ctx.step.wait_for_signal("go")
        polled = await ctx.step.wait_for("poll", lambda: {"p": [1]}, interval=0.05)
        seen = json.loads(json.dumps([step, signal, polled]))
        for got in (step["k"], signal["s"], polled["p"]):
            got.append("changed")
        await ctx.step.sleep("replay", 0.05)  # the body replays: journaled values again
        return seen

    return wf


async def test_a_value_user_code_changes_is_never_what_a_later_reader_sees(
    engine_of: Factory,
) -> None:
    """A stage that changed ``ctx.output_of(...)`` or a dict in ``ctx.input`` changed what
    its sibling got in the same native process; a body that changed a step's result (or a
    signal's payload) changed the value Temporal journaled, which the replay then returned."""
    wf = _mutating()
    async with engine_of([wf]) as engine:
        run = await engine.start(wf.id, {"x": {"n": [1]}})
        await engine.signal(run.id, "go", {"s": [1]})
        info = await engine.wait(run.id, timeout=60)
    assert info.status == RunStatus.COMPLETED, info.error
    assert info.stage("reads").output == [{"n": [1]}, {"n": [1]}]
    assert info.stage("first").output == {"n": [1]}
    assert info.output == [{"k": [1]}, {"s": [1]}, {"p": [1]}]


# -- 3. the claim check -------------------------------------------------------------------------

THRESHOLD = 1024


def _of_size(size: int, around: Callable[[Any], Any] = lambda v: v) -> dict[str, str]:
    """A value of non-ASCII text (2 bytes a character) such that ``around(value)`` is
    ``size`` bytes of JSON."""
    value = {"t": ""}
    left = size - len(dumps(around(value)))
    value["t"] = "é" * (left // 2) + "x" * (left % 2)
    assert len(dumps(around(value))) == size
    return value


def _sizing() -> Workflow[Loose]:
    wf = Workflow(f"sizes-{uuid.uuid4().hex[:6]}", input=Loose)

    @wf.stage
    async def echo(ctx: StageContext[Loose]) -> Any:
        given = ctx.input.model_dump()["v"]
        value = given if ctx.input.case == "as given" else _of_size(THRESHOLD + int(ctx.input.case))
        step = await ctx.step.run("step", lambda: value)
        signal = await ctx.step.wait_for_signal("go")
        return {"step": step, "signal": signal, "input": given} if step != signal else value

    @wf.stage(after=[echo])
    async def again(ctx: StageContext[Loose]) -> Any:
        return ctx.output_of(echo)

    return wf


@pytest.mark.parametrize("delta", [-1, 0, 1])
async def test_values_around_the_spill_threshold_come_back_the_same_inline_or_spilled(
    engine_of: Factory, delta: int
) -> None:
    """The run input, a signal payload, a step result and a stage output of
    ``spill_threshold_bytes + delta`` bytes of JSON: inline at or under it, spilled over it,
    and the same value back either way."""
    wf = _sizing()
    store = MemoryBlobStore()
    case = str(delta)
    given = _of_size(THRESHOLD + delta, lambda v: {"case": case, "v": v})
    value = _of_size(THRESHOLD + delta)
    async with engine_of([wf], store, spill_threshold_bytes=THRESHOLD) as engine:
        run = await engine.start(wf.id, {"case": case, "v": given})
        await engine.signal(run.id, "go", value)
        info = await engine.wait(run.id, timeout=60)
    assert info.status == RunStatus.COMPLETED, info.error
    assert _same(info.input, {"case": case, "v": given})
    assert _same(info.output, value) and _same(info.stage("echo").output, value)
    # the blobs that hold the value itself (Temporal keeps its journal in the store too)
    spilled = [
        k
        for k, data in store.blobs.items()
        if k.startswith(f"runs/{run.id}/") and data in (dumps(value), dumps(info.input))
    ]
    if delta <= 0:
        assert not spilled, "a value at or under the threshold stays inline"
    else:
        assert any(store.blobs[k] == dumps(info.input) for k in spilled), "the input spills"
        assert any(store.blobs[k] == dumps(value) for k in spilled), "the values spill"


async def test_a_user_value_shaped_exactly_like_a_reference_is_the_users_data(
    engine_of: Factory,
) -> None:
    """A reference with every field the drivers write (key, size, sha256) naming a blob of
    the run itself, as input, signal payload, step result and output."""
    wf = _sizing()
    store = MemoryBlobStore()
    big = _of_size(THRESHOLD * 2)
    async with engine_of([wf], store, spill_threshold_bytes=THRESHOLD) as engine:
        first = await engine.start(wf.id, {"case": "as given", "v": big})
        await engine.signal(first.id, "go", big)
        assert (await engine.wait(first.id, timeout=60)).status == RunStatus.COMPLETED
        key = sorted(k for k in store.blobs if k.startswith(f"runs/{first.id}/"))[0]
        forged = ClaimCheck.reference(key, store.blobs[key])
        assert forged["$wfe_spill"]["size"] == len(store.blobs[key])
        run = await engine.start(wf.id, {"case": "as given", "v": forged})
        await engine.signal(run.id, "go", forged)
        info = await engine.wait(run.id, timeout=60)
    assert info.status == RunStatus.COMPLETED, info.error
    assert info.input == {"case": "as given", "v": forged}
    assert info.output == forged and info.stage("echo").output == forged
