"""DatabaseBlobStore (blob_url="db://"): the BlobStore port on the wfe_blobs table."""

from __future__ import annotations

import pytest

from driver_native import Database
from driver_native._dbblobs import DatabaseBlobStore
from engine_port import ClaimCheck, is_spill_ref
from engine_port.errors import SpilledPayloadUnavailableError, UnsafeBlobKeyError

from . import workflows as w
from .conftest import MakeEngine, count_rows


async def test_round_trip(database_url: str) -> None:
    db = Database(database_url)
    db.upgrade()
    store = DatabaseBlobStore(db)
    try:
        payload = bytes(range(256)) * 1000
        await store.put("runs/r1/a", payload)
        await store.put("runs/r1/b_x", b"1")
        await store.put("runs/r10/c", b"2")
        await store.put("runs/r1/a", payload + b"!")  # overwrite
        assert await store.get("runs/r1/a") == payload + b"!"
        assert await store.has("runs/r1/a")
        assert not await store.has("runs/r1/zz")
        assert await store.list("runs/r1/") == ["runs/r1/a", "runs/r1/b_x"]
        assert await store.list("runs/r1/b_") == ["runs/r1/b_x"]  # '_' is literal
        assert await store.list("runs/r1/b%") == []  # '%' is literal
        assert await store.list() == ["runs/r1/a", "runs/r1/b_x", "runs/r10/c"]
        await store.delete("runs/r1/a")
        await store.delete("runs/r1/a")  # deleting a missing key is fine
        with pytest.raises(SpilledPayloadUnavailableError):
            await store.get("runs/r1/a")
        claim = ClaimCheck(store, threshold=10)
        ref = await claim.dump({"v": "x" * 100}, "runs/r2/out")
        assert is_spill_ref(ref)
        assert await claim.load(ref, run_id="r2") == {"v": "x" * 100}
    finally:
        db.dispose()


@pytest.mark.parametrize(
    "key", ["../escape", "/etc/passwd", "runs/../../x", "a//b", "a\\b", "", "./a", "a/\x00"]
)
async def test_unsafe_keys_are_rejected_and_nothing_is_written(database_url: str, key: str) -> None:
    db = Database(database_url)
    db.upgrade()
    store = DatabaseBlobStore(db)
    try:
        for op in (store.put(key, b"x"), store.get(key), store.has(key), store.delete(key)):
            with pytest.raises(UnsafeBlobKeyError):
                await op
        assert await store.list() == []
    finally:
        db.dispose()


async def test_engine_spills_into_the_database(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.big, blob_url="db://")
    assert isinstance(engine.kernel.claim.store, DatabaseBlobStore)
    run = await engine.start("it-big", {"n": 100})
    async with engine.worker():
        info = await engine.wait(run.id, timeout=10)
    assert info.status == "completed"
    assert info.output == "x" * 100 * 1024 + "y"
    keys = await engine.kernel.claim.store.list(f"runs/{run.id}/")
    assert any("/output-" in k for k in keys)
    assert any("/steps/" in k for k in keys)
    assert await count_rows(engine, "wfe_blobs") == len(keys)


@pytest.mark.postgres
async def test_postgres_without_a_blob_url_keeps_blobs_in_the_database(
    pg_session: object, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative blob folder would differ per host; with PostgreSQL and no blob_url of its
    own, claim-checked values go to the database (issue 15), and no folder is created."""
    from pathlib import Path

    from engine_port import EngineSettings, Registry, create_engine

    assert isinstance(tmp_path, Path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WFE_BLOB_URL", raising=False)
    url = pg_session.new_schema()  # type: ignore[attr-defined]
    settings = EngineSettings(database_url=url)
    assert "blob_url" not in settings.model_fields_set
    async with create_engine(settings, Registry([w.big])) as engine, engine.worker():
        run = await engine.start(w.big.id, {"n": 1})
        info = await engine.wait(run.id, timeout=30)
        assert info.status == "completed"
        assert await count_rows(engine, "wfe_blobs") >= 1  # type: ignore[arg-type]
    assert not (tmp_path / ".wfe").exists()
