"""Blob keys made of stage ids and step names stay apart on a case-insensitive store (a folder
store on macOS or Windows): stages ``A`` and ``a`` of one run shared one step journal there,
steps ``Charge`` and ``charge`` one spilled result, and a journaled step of one was read as the
other's. Runs started before ``StartDocument.blob_keys`` keep their keys (their journals and
spilled values stay where their code put them)."""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from driver_temporal._journal import StepJournal
from driver_temporal._start import StartDocument
from driver_temporal._steps import run_steps
from driver_temporal._wire import (
    BLOB_KEYS_CASE_SAFE,
    journal_key,
    journal_prefix,
    journal_stage_part,
    spill_key,
)
from engine_port import (
    EngineSettings,
    MemoryBlobStore,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    create_engine,
    migrate_run,
)

from .conftest import EngineFactory

NAMES = ["A", "a", "Charge", "charge", "CHARGE", "cHarge", "x_Y-1", "x_y-1", "plain", "p-q"]


def test_case_safe_parts_differ_whatever_the_case() -> None:
    for build in (
        lambda n: journal_prefix("run1", n, 0, "stage", case_safe=True),
        lambda n: spill_key("run1", "steps", "s", 0, n, case_safe=True),
        lambda n: spill_key("run1", "outputs", n, "r0-a1", case_safe=True),
        lambda n: journal_key("runs/run1/steps/s/r0/stage/", n, case_safe=True),
    ):
        keys = [build(n) for n in NAMES]
        assert len({k.lower() for k in keys}) == len(NAMES), keys
    # a name without an upper-case letter keeps its part (readable, and the same as before)
    assert journal_stage_part("charge", True) == "charge"
    assert journal_stage_part("Charge", True).startswith("Charge.")
    # a lower-case name spelled like another's case-safe part stays apart (no '.' in a safe name)
    part = journal_stage_part("A", True)
    assert journal_stage_part(part.lower(), True) != part.lower()  # hashed: not safe


def test_runs_started_before_keep_their_keys() -> None:
    """The keys of a run without ``blob_keys`` are those its code made (its journals and
    spilled values must still be found after an upgrade)."""
    assert journal_prefix("run1", "A", 2, "stage") == "runs/run1/steps/A/r2/stage/"
    assert journal_prefix("run1", "a b", 0, "compensate").startswith("runs/run1/steps/")
    assert spill_key("run1", "outputs", "A", "r0-a1") == "runs/run1/outputs/A/r0-a1.json"
    assert spill_key("run1", "steps", "A", 0, "Charge").endswith("/A/") is False
    assert spill_key("run1", "steps", "A", 0, "Charge").endswith("/Charge.json")
    assert spill_key("run1", "x", "") == "runs/run1/x/.json"
    assert journal_key("p/", "Charge") == "p/Charge.json"
    # the start document of an older run lacks the field: the old keys
    old = StartDocument.model_validate(
        {"run_id": "r", "workflow_id": "w", "version": "1", "graph": {}}
    )
    assert not old.case_safe_keys
    new = StartDocument.for_engine(
        EngineSettings(), 3.0, run_id="r", workflow_id="w", version="1", graph={}
    )
    assert new.case_safe_keys and new.memo()["blob_keys"] == BLOB_KEYS_CASE_SAFE


def test_steps_listing_reads_either_shape() -> None:
    rec = {"name": "n", "kind": "run", "completed": True}
    for case_safe in (False, True):
        journals = {
            (journal_stage_part("A", case_safe), 0, "stage"): [rec],
            (journal_stage_part("a", case_safe), 0, "stage"): [{**rec, "name": "m"}],
        }
        got = [(e.stage, e.name) for e in run_steps(["A", "a"], 0, {}, journals)]
        assert got == [("A", "n"), ("a", "m")]


async def test_stores_that_cannot_append_keep_case_apart() -> None:
    """On a store that cannot append (S3, memory) each record is a blob named after its step:
    ``Charge`` and ``charge`` got keys equal under a case-insensitive backend."""
    store = MemoryBlobStore()
    prefix = journal_prefix("run3", "S", 0, "stage", case_safe=True)
    j = StepJournal(store, prefix, case_safe=True)
    for name in ("Charge", "charge"):
        await j.append({"name": name, "kind": "run", "completed": True, "result": name})
    j.close()
    keys = await store.list(prefix)
    assert len({k.lower() for k in keys}) == 2, keys
    got = {r["name"]: r["result"] for r in await StepJournal(store, prefix).read()}
    assert got == {"Charge": "Charge", "charge": "charge"}


class In(BaseModel):
    n: int = 0


def twins() -> Workflow[In]:
    """Stages ``A`` and ``a``, each with steps ``Charge`` and ``charge`` whose results spill,
    a nap between (the attempt after it replays them from the journal), and a spilled
    output."""
    wf = Workflow("twins", input=In)

    def body(tag: str) -> object:
        async def stage(ctx: StageContext[In]) -> dict[str, str]:
            big = await ctx.step.run("Charge", lambda: f"{tag}-upper-" + "x" * 64)
            small = await ctx.step.run("charge", lambda: f"{tag}-lower-" + "y" * 64)
            await ctx.step.sleep("nap", timedelta(milliseconds=200))
            return {"Charge": str(big), "charge": str(small), "pad": "z" * 64}

        return stage

    wf.stage(body("A"), id="A")  # type: ignore[arg-type]
    wf.stage(body("a"), id="a")  # type: ignore[arg-type]
    return wf


@pytest.mark.temporal
async def test_twin_stages_and_steps_get_keys_apart(
    make_engine: EngineFactory, blob_dir: Path
) -> None:
    engine = make_engine(Registry([twins()]), spill_threshold_bytes=16)
    async with engine, engine.worker():
        run = await engine.start("twins", {})
        info = await engine.wait(run.id, timeout=60)
        steps = await engine.steps(run.id)
    assert info.status == "completed", info
    for tag in ("A", "a"):
        out = info.stage(tag).output
        assert out["Charge"].startswith(f"{tag}-upper-"), out
        assert out["charge"].startswith(f"{tag}-lower-"), out
    assert [(e.stage, e.name) for e in steps] == [
        ("A", "Charge"),
        ("A", "charge"),
        ("A", "nap"),
        ("a", "Charge"),
        ("a", "charge"),
        ("a", "nap"),
    ]
    keys = [str(p.relative_to(blob_dir)) for p in (blob_dir / "runs" / run.id).rglob("*")]
    keys = [k for k in keys if (blob_dir / k).is_file()]
    # two journals, four spilled step results, two spilled outputs at least
    assert sum(k.endswith("journal.jsonl") for k in keys) == 2, keys
    assert len([k for k in keys if "/steps/" in k and not k.endswith(".jsonl")]) >= 4, keys
    assert len([k for k in keys if "/outputs/" in k]) >= 2, keys
    lowered = [k.lower() for k in keys]
    assert len(set(lowered)) == len(keys), sorted(keys)


def twins_waiting() -> Workflow[In]:
    """``A`` then ``a``, each with spilled steps ``Charge`` and ``charge``; ``a`` then waits
    for signal ``go``."""
    wf = Workflow(f"twins-{uuid.uuid4().hex[:8]}", input=In)

    def body(tag: str, wait: bool) -> object:
        async def stage(ctx: StageContext[In]) -> dict[str, Any]:
            big = await ctx.step.run("Charge", lambda: f"{tag}-upper-" + "x" * 64)
            small = await ctx.step.run("charge", lambda: f"{tag}-lower-" + "y" * 64)
            got = await ctx.step.wait_for_signal("go") if wait else None
            return {"Charge": big, "charge": small, "got": got}

        return stage

    wf.stage(body("A", False), id="A")  # type: ignore[arg-type]
    wf.stage(body("a", True), id="a", after=["A"])  # type: ignore[arg-type]
    return wf


@pytest.mark.temporal
@pytest.mark.parametrize("shape", ["case-safe", "before"])
async def test_spilled_values_of_either_key_shape_move_to_native(
    temporal_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """A run of either key shape moves off Temporal (its spilled step results and output
    copied to the target's own store by the keys its references carry) and finishes there
    with each step's own value."""
    if shape == "before":  # a run started by a driver without ``blob_keys``
        monkeypatch.setattr("driver_temporal._start.BLOB_KEYS_CASE_SAFE", None)
    wf = twins_waiting()
    registry = Registry([wf])
    source = create_engine(
        EngineSettings(
            driver="temporal",
            temporal_address=temporal_address,
            task_queue=f"ck-{uuid.uuid4().hex[:10]}",
            blob_url=f"file://{tmp_path / 'temporal-blobs'}",
            spill_threshold_bytes=16,
        ),
        registry,
    )
    target = create_engine(
        EngineSettings(
            database_url=f"sqlite:///{tmp_path / 'dst.db'}",
            blob_url=f"file://{tmp_path / 'native-blobs'}",
            spill_threshold_bytes=16,
        ),
        registry,
    )
    async with source as src, target as dst:
        run = await src.start(wf.id, {})
        async with src.worker():
            deadline = asyncio.get_running_loop().time() + 30
            while (await src.get_run(run.id)).status != RunStatus.SUSPENDED:
                assert asyncio.get_running_loop().time() < deadline, "never suspended"
                await asyncio.sleep(0.05)
        stage_a = tmp_path / "temporal-blobs" / "runs" / run.id / "steps"
        parts = sorted(os.listdir(stage_a))
        assert ("A" in parts) == (shape == "before"), parts
        assert (await migrate_run(src, dst, run.id)).outcome == "moved"
        async with dst.worker():
            await dst.signal(run.id, "go", {"ok": True})
            info = await dst.wait(run.id, timeout=30)
    assert info.status == RunStatus.COMPLETED, info
    for tag in ("A", "a"):
        out = info.stage(tag).output
        assert out["Charge"].startswith(f"{tag}-upper-"), out
        assert out["charge"].startswith(f"{tag}-lower-"), out
    assert info.stage("a").output["got"] == {"ok": True}
