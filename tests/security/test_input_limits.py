"""Values a backend cannot store are refused in the port, before user code runs and before
anything is written, with the same InvalidInputError on SQLite, PostgreSQL and Temporal; and
stored errors never carry SQL text or parameters (issue 11, item 3)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from driver_native import NativeEngine, process_available_jobs
from engine_port import (
    EngineSettings,
    FolderBlobStore,
    InMemoryLedger,
    MemoryBlobStore,
    MemorySink,
    Registry,
    Retry,
    StageContext,
    StageRequest,
    StageRunner,
    StepRecord,
    Workflow,
    WorkflowEngine,
    create_engine,
)
from engine_port.errors import DefinitionError, InvalidInputError

CARD = "4111 1111 1111 1111"


class In(BaseModel):
    note: str = ""
    data: Any = None


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# -- engines ---------------------------------------------------------------------------------

calls: dict[str, int] = {}


def _count(name: str) -> None:
    calls[name] = calls.get(name, 0) + 1


def _workflows() -> list[Workflow[Any]]:
    """One workflow per inside-stage case; each stage allows 3 attempts, so one attempt
    shows the failure was not retried."""
    retry = Retry(max_attempts=3)
    wfs: list[Workflow[Any]] = []

    def wf(wf_id: str) -> Workflow[In]:
        w = Workflow(wf_id, input=In)
        wfs.append(w)
        return w

    def step_fn(result: Any = "ok") -> Callable[[], Any]:
        def fn() -> Any:
            _count("step")
            return result

        return fn

    waiter = wf("waiter")

    @waiter.stage(retry=retry)
    async def wait(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    long_step = wf("long-step")

    @long_step.stage(retry=retry)
    async def s1(ctx: StageContext[In]) -> Any:
        return await ctx.step.run("s" * 300, step_fn())

    nul_step = wf("nul-step")

    @nul_step.stage(retry=retry)
    async def s2(ctx: StageContext[In]) -> Any:
        return await ctx.step.run("a\x00b", step_fn())

    long_sleep = wf("long-sleep")

    @long_sleep.stage(retry=retry)
    async def s3(ctx: StageContext[In]) -> Any:
        _count("step")
        await ctx.step.sleep("z" * 260, 1)

    long_signal = wf("long-signal")

    @long_signal.stage(retry=retry)
    async def s4(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("g" * 300)

    long_event = wf("long-event")

    @long_event.stage(retry=retry)
    async def s5(ctx: StageContext[In]) -> Any:
        ctx.emit("e" * 400, {})
        return await ctx.step.run("after", step_fn())

    nul_event = wf("nul-event")

    @nul_event.stage(retry=retry)
    async def s6(ctx: StageContext[In]) -> Any:
        ctx.emit("order.noted", {"note": "a\x00b"})
        return await ctx.step.run("after", step_fn())

    nul_result = wf("nul-result")

    @nul_result.stage(retry=retry)
    async def s7(ctx: StageContext[In]) -> Any:
        return await ctx.step.run("charge", step_fn("txn\x00"))

    nan_output = wf("nan-output")

    @nan_output.stage(retry=retry)
    async def s8(ctx: StageContext[In]) -> Any:
        _count("step")
        return {"total": float("nan")}

    deep_output = wf("deep-output")

    @deep_output.stage(retry=retry)
    async def s9(ctx: StageContext[In]) -> Any:
        _count("step")
        return _nested(100)

    card = wf("card")

    @card.stage(retry=Retry(max_attempts=1))
    async def pay(ctx: StageContext[In]) -> Any:
        number = await ctx.step.run("card", step_fn(CARD))
        # user code's own database call fails; SQLAlchemy puts the parameters in str(exc)
        db = sa.create_engine("sqlite://")
        with db.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (card TEXT CHECK (length(card) < 5))"))
            conn.execute(sa.text("INSERT INTO t VALUES (:card)"), {"card": number})
        return "paid"

    return wfs


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


@pytest.fixture
async def native(database_url: str, tmp_path: Path) -> AsyncIterator[NativeEngine]:
    settings = EngineSettings(database_url=database_url, blob_url=f"file://{tmp_path / 'b'}")
    engine = create_engine(settings, Registry(_workflows()), event_sink=MemorySink())
    assert isinstance(engine, NativeEngine)
    async with engine:
        yield engine


def _temporal() -> WorkflowEngine:
    """A Temporal engine that is never connected: the checks come before any server call,
    so each call below raises InvalidInputError, not DriverUnavailableError."""
    from driver_temporal import create_temporal_engine

    settings = EngineSettings(driver="temporal", temporal_address="127.0.0.1:1")
    return create_temporal_engine(settings, Registry(_workflows()), blob_store=MemoryBlobStore())


async def _rows(engine: NativeEngine) -> dict[str, int]:
    from driver_native import _schema

    def count(conn: sa.Connection) -> dict[str, int]:
        return {
            t.name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())
            for t in _schema.metadata.sorted_tables
        }

    return await engine.kernel.db.read(count)


# -- public calls ----------------------------------------------------------------------------

Call = Callable[[WorkflowEngine, str], Awaitable[Any]]

PUBLIC_CASES: list[tuple[str, Call, str, str]] = [
    # (case, call(engine, active run id), field named, words in the message)
    ("start long workflow id", lambda e, r: e.start("w" * 201, {}), "workflow id", "limit is 200"),
    (
        "start long key",
        lambda e, r: e.start("waiter", {}, idempotency_key="k" * 301),
        "idempotency_key",
        "301 characters; the limit is 300",
    ),
    (
        "start NUL key",
        lambda e, r: e.start("waiter", {}, idempotency_key="k\x00"),
        "idempotency_key",
        "NUL character",
    ),
    (
        "start long version",
        lambda e, r: e.start("waiter", {}, version="v" * 101),
        "version",
        "limit is 100",
    ),
    ("start NUL input", lambda e, r: e.start("waiter", {"note": "a\x00b"}), "input", "NUL"),
    (
        "start surrogate input",
        lambda e, r: e.start("waiter", {"note": "a\ud800"}),
        "input",
        "lone surrogate",
    ),
    (
        "start deep input",
        lambda e, r: e.start("waiter", {"data": _nested(70)}),
        "input",
        "the limit is 64",
    ),
    ("signal long run id", lambda e, r: e.signal("r" * 65, "go"), "run id", "limit is 64"),
    ("signal NUL run id", lambda e, r: e.signal("r\x00", "go"), "run id", "NUL"),
    (
        "signal long name",
        lambda e, r: e.signal(r, "g" * 412),
        "signal name",
        "412 characters; the limit is 200",
    ),
    ("signal NUL name", lambda e, r: e.signal(r, "go\x00"), "signal name", "NUL"),
    (
        "signal long key",
        lambda e, r: e.signal(r, "go", 1, idempotency_key="k" * 301),
        "signal idempotency_key",
        "limit is 300",
    ),
    (
        "signal NUL payload",
        lambda e, r: e.signal(r, "go", {"card": "4111\x00"}),
        "signal payload",
        "signal payload at $.card contains a NUL character",
    ),
    (
        "signal deep payload",
        lambda e, r: e.signal(r, "go", _nested(65)),
        "signal payload",
        "limit is 64",
    ),
    # deeper, a NaN, an object: the caller's input too (they were the SerializationError a
    # stage's output gets, telling the caller to "return pydantic models")
    (
        "signal very deep payload",
        lambda e, r: e.signal(r, "go", _nested(300)),
        "signal payload",
        "limit is 64",
    ),
    (
        "signal NaN payload",
        lambda e, r: e.signal(r, "go", {"x": float("nan")}),
        "signal payload",
        "signal payload.x contains nan, which JSON cannot carry",
    ),
    (
        "signal non-JSON payload",
        lambda e, r: e.signal(r, "go", object()),
        "signal payload",
        "send JSON data",
    ),
    ("get_run long id", lambda e, r: e.get_run("x" * 65), "run id", "limit is 64"),
    ("get_run NUL id", lambda e, r: e.get_run("a\x00"), "run id", "NUL"),
    ("wait NUL id", lambda e, r: e.wait("a\x00", timeout=1), "run id", "NUL"),
    ("cancel long id", lambda e, r: e.cancel("x" * 65), "run id", "limit is 64"),
    ("redrive NUL id", lambda e, r: e.redrive("a\x00"), "run id", "NUL"),
    (
        "redrive long version",
        lambda e, r: e.redrive(r, version="v" * 101),
        "version",
        "limit is 100",
    ),
    ("list_runs NUL workflow", lambda e, r: e.list_runs(workflow_id="w\x00"), "workflow id", "NUL"),
]


@pytest.mark.parametrize(
    ("call", "field", "words"),
    [pytest.param(c, f, w, id=name) for name, c, f, w in PUBLIC_CASES],
)
async def test_a_public_call_refuses_what_a_backend_cannot_store_and_writes_nothing(
    native: NativeEngine, call: Call, field: str, words: str
) -> None:
    active = await native.start("waiter", {})
    runs_before = await native.list_runs()
    rows_before = await _rows(native)
    with pytest.raises(InvalidInputError) as err:
        await call(native, active.id)
    assert err.value.fields == (field,)
    assert words in str(err.value)
    assert "\x00" not in str(err.value) and "4111" not in str(err.value)
    assert await native.list_runs() == runs_before
    assert await _rows(native) == rows_before

    # the Temporal driver refuses the same call with the same error, before any server call
    with pytest.raises(InvalidInputError) as on_temporal:
        await call(_temporal(), active.id)
    assert str(on_temporal.value) == str(err.value)


# -- inside a stage --------------------------------------------------------------------------

INSIDE_CASES = [
    ("long-step", 0, "InvalidInputError", "step name is 300 characters; the limit is 200"),
    ("nul-step", 0, "InvalidInputError", "step name contains a NUL character"),
    ("long-sleep", 1, "InvalidInputError", "step name is 260 characters"),
    ("long-signal", 0, "InvalidInputError", "signal name is 300 characters"),
    ("long-event", 0, "InvalidInputError", "event type is 400 characters"),
    (
        "nul-event",
        0,
        "InvalidInputError",
        "data of event 'order.noted' at $.note contains a NUL character",
    ),
    ("nul-result", 1, "InvalidInputError", "result of step 'charge' contains a NUL character"),
    # NaN is not JSON at all: the serialiser refuses it (SerializationError, never retried)
    ("nan-output", 1, "SerializationError", "output of stage 's8'.total contains nan"),
    ("deep-output", 1, "InvalidInputError", "nested more than 64 levels deep"),
]


@pytest.mark.parametrize(("wf_id", "step_runs", "error", "words"), INSIDE_CASES)
async def test_a_stage_using_an_unstorable_name_or_value_fails_once_without_retry(
    native: NativeEngine, wf_id: str, step_runs: int, error: str, words: str
) -> None:
    run = await native.start(wf_id, {})
    await process_available_jobs(native.kernel, 10)
    info = await native.get_run(run.id)
    assert info.status == "failed"
    assert info.error is not None and info.error.type == error
    assert words in info.error.message
    assert [s.attempt for s in info.stages] == [1]  # not retried
    # the step function (or the body's side effect) ran as often as the case needs: zero
    # times when the name was refused, once when its result was
    assert calls.get("step", 0) == step_runs
    # nothing of the refused step was journaled
    steps = await native.kernel.db.read(
        lambda c: c.execute(sa.text("SELECT name FROM wfe_steps")).scalars().all()
    )
    assert steps == []


# -- error records ---------------------------------------------------------------------------


async def test_a_database_error_in_user_code_is_recorded_without_sql_or_parameters(
    native: NativeEngine,
) -> None:
    run = await native.start("card", {})
    await process_available_jobs(native.kernel, 10)
    info = await native.get_run(run.id)
    assert info.status == "failed"
    assert info.error is not None and info.error.type == "IntegrityError"
    assert "CHECK constraint failed" in info.error.message
    assert CARD not in info.model_dump_json()
    assert "[SQL" not in info.error.message and "INSERT" not in info.error.message
    events = await native.events(run.id)
    assert any(e.type == "stage.failed" for e in events)
    assert all(CARD not in e.model_dump_json() for e in events)
    await native.flush_events()
    sink = native.event_sink
    assert isinstance(sink, MemorySink)
    assert sink.events and all(CARD not in e.model_dump_json() for e in sink.events)


class _RejectingLedger(InMemoryLedger):
    """A ledger whose database rejects the step result (as PostgreSQL rejected NUL bytes)."""

    async def put(self, record: StepRecord) -> None:
        raise sa.exc.DataError(
            "INSERT INTO wfe_steps (run_id, name, result) VALUES (%(run_id)s, %(name)s, "
            "%(result)s)",
            {"run_id": "r1", "name": record.name, "result": record.result},
            Exception(f'invalid input syntax for type json: "{record.result}"\nDETAIL: ...'),
        )


async def test_a_journaling_error_is_recorded_without_the_step_result() -> None:
    wf = Workflow("journal", input=In)

    @wf.stage
    async def pay(ctx: StageContext[In]) -> Any:
        return await ctx.step.run("card", lambda: CARD)

    runner = StageRunner(Registry([wf]))
    outcome = await runner.run(
        StageRequest(run_id="r1", workflow=wf, stage_id="pay", attempt=1, input={}),
        _RejectingLedger(),
    )
    error = outcome.error  # type: ignore[union-attr]
    assert error.type == "DataError"
    assert "invalid input syntax for type json" in error.message
    assert CARD not in error.message and "INSERT" not in error.message


# -- definitions -----------------------------------------------------------------------------


def test_definitions_over_the_limits_are_refused_when_declared() -> None:
    with pytest.raises(DefinitionError, match="workflow id is 201 characters; the limit is 200"):
        Workflow("w" * 201, input=In)
    with pytest.raises(DefinitionError, match="version is 101 characters; the limit is 100"):
        Workflow("w", input=In, version="v" * 101)
    with pytest.raises(DefinitionError, match="version contains a NUL character"):
        Workflow("w", input=In, version="1\x00")
    with pytest.raises(DefinitionError, match="hook name is 201 characters"):
        Workflow("w", input=In, hooks=["h" * 201])
    wf = Workflow("w", input=In)
    with pytest.raises(DefinitionError, match="stage id is 201 characters"):

        @wf.stage(id="s" * 201)
        async def body(ctx: StageContext[In]) -> None: ...

    with pytest.raises(DefinitionError, match="hook name contains a NUL character"):
        wf.hook_point("h\x00")
    with pytest.raises(DefinitionError, match="hook handler name is 201 characters"):
        Registry().register_hook("h", lambda ctx, p: None, name="x" * 201)


@pytest.mark.temporal
@pytest.mark.parametrize(("wf_id", "step_runs", "error", "words"), INSIDE_CASES[:5])
async def test_on_temporal_a_stage_using_an_unstorable_name_fails_once_without_retry(
    temporal_server: Any, tmp_path: Path, wf_id: str, step_runs: int, error: str, words: str
) -> None:
    from driver_temporal import create_temporal_engine

    settings = EngineSettings(
        driver="temporal",
        temporal_address=temporal_server.address,
        task_queue=f"limits-{uuid.uuid4().hex[:10]}",
        blob_url=f"file://{tmp_path / 'b'}",
    )
    engine = create_temporal_engine(
        settings,
        Registry(_workflows()),
        blob_store=FolderBlobStore(tmp_path / "b"),
        heartbeat_timeout=3.0,
    )
    async with engine, engine.worker():
        run = await engine.start(wf_id, {})
        info = await engine.wait(run.id, timeout=60)
    assert info.status == "failed"
    assert info.error is not None and info.error.type == error
    assert words in info.error.message
    assert [s.attempt for s in info.stages] == [1]
    assert calls.get("step", 0) == step_runs


# -- imports ---------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["/x", "/../..", " b'"])
async def test_an_imported_run_id_no_driver_makes_is_refused_and_writes_nothing(
    native: NativeEngine, suffix: str
) -> None:
    """A snapshot's run id is the imported run's id and its blob prefix ``runs/<id>/``: one
    edited to "<another run>/x" was imported, its blobs inside the other run's prefix (which
    that run's purge deletes), and one holding '..' or a quote was imported too."""
    victim = await native.start("waiter", {})
    snapshot = (await native.export_run(victim.id)).model_dump(mode="json")
    await native.abort_export(victim.id)
    rows_before = await _rows(native)
    edited = {**snapshot, "run_id": victim.id + suffix}
    with pytest.raises(InvalidInputError) as err:
        await native.import_run(edited)
    assert err.value.fields == ("snapshot",)
    assert "may hold only letters, digits, '_' and '-'" in str(err.value)
    assert await _rows(native) == rows_before
    # the Temporal driver refuses it the same way, before any server call
    with pytest.raises(InvalidInputError) as on_temporal:
        await _temporal().import_run(edited)
    assert str(on_temporal.value) == str(err.value)
