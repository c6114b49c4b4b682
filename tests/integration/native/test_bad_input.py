"""Bad input gets a typed error and writes nothing (rows counted before and after)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import pytest

from driver_native import CreateRun, process_available_jobs
from driver_native._engine import NativeEngine
from engine_port import FolderBlobStore
from engine_port.errors import (
    IdempotencyConflictError,
    InvalidInputError,
    RunNotActiveError,
    RunNotFoundError,
    UnsafeBlobKeyError,
    WorkflowNotFoundError,
)

from . import workflows as w
from .conftest import MakeEngine, row_counts


async def _writes_nothing(
    engine: NativeEngine, call: Awaitable[Any], error: type[Exception]
) -> pytest.ExceptionInfo[Exception]:
    before = await row_counts(engine)
    blobs_before = await engine.kernel.claim.store.list()
    with pytest.raises(error) as info:
        await call
    assert await row_counts(engine) == before
    assert await engine.kernel.claim.store.list() == blobs_before
    return info


@pytest.mark.parametrize("blobs", ["file", "db"])
async def test_bad_input_writes_nothing(make_engine: MakeEngine, blobs: str) -> None:
    kw = {"blob_url": "db://"} if blobs == "db" else {}
    engine = await make_engine(w.linear, w.waiter, spill_threshold_bytes=64, **kw)
    done = await engine.start("it-linear", {"n": 1}, idempotency_key="k-1")
    active = await engine.start("it-waiter", {"n": 1})
    await process_available_jobs(engine.kernel, 10)
    assert (await engine.get_run(done.id)).status == "completed"

    await _writes_nothing(engine, engine.start("no-such-wf", {}), WorkflowNotFoundError)
    err = await _writes_nothing(
        engine, engine.start("it-linear", {"n": "not a number"}), InvalidInputError
    )
    assert "n" in err.value.fields
    for call in (
        engine.signal("no-such-run", "go", 1),
        engine.cancel("no-such-run"),
        engine.get_run("no-such-run"),
        engine.redrive("no-such-run"),
    ):
        await _writes_nothing(engine, call, RunNotFoundError)
    await _writes_nothing(engine, engine.signal(done.id, "go", 1), RunNotActiveError)
    await _writes_nothing(engine, engine.cancel(done.id), RunNotActiveError)
    await _writes_nothing(
        engine,
        engine.start("it-linear", {"n": 2}, idempotency_key="k-1"),
        IdempotencyConflictError,
    )
    # a large input (spilled to the blob store) with a conflicting key: no orphan blob either
    await _writes_nothing(
        engine,
        engine.start("it-linear", {"n": 2, "note": "x" * 500}, idempotency_key="k-1"),
        IdempotencyConflictError,
    )
    await _writes_nothing(engine, engine.signal(active.id, "go", object()), InvalidInputError)
    await _writes_nothing(
        engine,
        engine.kernel.dispatch(CreateRun("no-such-wf", {}), idempotency_key="kk"),
        WorkflowNotFoundError,
    )
    store = engine.kernel.claim.store
    for key in ("../outside", "/abs/path", "runs/../../x"):
        await _writes_nothing(engine, store.put(key, b"x"), UnsafeBlobKeyError)
    # the run that was signalled with bad payloads still works
    await engine.signal(active.id, "go", {"ok": 1})
    await process_available_jobs(engine.kernel, 10)
    assert (await engine.get_run(active.id)).output == {"got": {"ok": 1}}


async def test_repeat_start_with_a_large_input_writes_no_blob(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.linear, spill_threshold_bytes=64)
    big_input = {"n": 3, "note": "y" * 500}
    first = await engine.start("it-linear", big_input, idempotency_key="big")
    store = engine.kernel.claim.store
    assert isinstance(store, FolderBlobStore)
    blobs = await store.list()
    assert len(blobs) == 1 and blobs[0].startswith(f"runs/{first.id}/input")
    again = await engine.start("it-linear", big_input, idempotency_key="big")
    assert again.id == first.id
    assert await store.list() == blobs


async def test_an_unreachable_database_raises_driver_unavailable(tmp_path: Any) -> None:
    """Nothing listens on the port: connecting says which database and what to check."""
    import socket

    from engine_port import EngineSettings, Registry, create_engine
    from engine_port.errors import DriverUnavailableError

    with socket.socket() as s:  # a port that was free a moment ago, now closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/nowhere"
    engine = create_engine(
        # retried for one second, not the default ten: the message is what this test is about
        EngineSettings(database_url=url, blob_url=f"file://{tmp_path}", database_retry_seconds=1),
        Registry([w.linear]),
    )
    with pytest.raises(
        DriverUnavailableError, match=rf"(?s)127\.0\.0\.1:{port}.*check that the server runs"
    ) as info:
        await engine.connect()
    assert info.value.__cause__ is None  # no driver traceback chained into the user's error
