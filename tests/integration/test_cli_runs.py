"""The wfe command line on runs a test made: unique-prefix ids, ``show --events --steps``,
``dlq list``, and a listing that never reads a value (a missing blob does not break it)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from engine_port import (
    EngineSettings,
    Event,
    NonRetryableError,
    Registry,
    Retry,
    StageContext,
    Workflow,
    create_engine,
)
from wfe_cli import EXIT_CODES, app


class In(BaseModel):
    n: int = 0
    fail: bool = False


def _registry() -> Registry:
    wf = Workflow("cli-flow", input=In)

    @wf.stage(retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=10)))
    async def work(ctx: StageContext[In]) -> str:
        await ctx.step.run("fetch", lambda: {"ok": True})
        if ctx.input.fail:
            if ctx.attempt == 1:
                raise RuntimeError("first attempt breaks")
            raise NonRetryableError("the second attempt gives up")
        return "x" * 2000  # spilled: over the test's spill threshold

    gate = Workflow("cli-gate", input=In)

    @gate.stage(signals=["approval"])
    async def wait(ctx: StageContext[In]) -> object:
        return await ctx.step.wait_for_signal("approval")

    return Registry([wf, gate])


class _RefusingSink:
    async def publish(self, events: Sequence[Event]) -> None:
        raise ConnectionError("the sink is down")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    values = {
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "WFE_BLOB_URL": f"file://{tmp_path / 'blobs'}",
        "WFE_SPILL_THRESHOLD_BYTES": "1000",
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    return {"tmp": tmp_path}


def _runs(inputs: list[dict[str, Any]], sink: Any = None, **settings: Any) -> list[str]:
    async def go() -> list[str]:
        engine = create_engine(EngineSettings(**settings), _registry(), event_sink=sink)
        async with engine:
            ids = [(await engine.start("cli-flow", i)).id for i in inputs]
            async with engine.worker():
                for run_id in ids:
                    await engine.wait(run_id, timeout=30)
            if sink is not None:
                await engine.flush_events()
            return ids

    return asyncio.run(go())


def test_a_unique_prefix_names_a_run_everywhere(env: dict[str, Any]) -> None:
    ids = _runs([{"n": i} for i in range(20)])
    runner = CliRunner()
    prefixes: dict[str, list[str]] = {}
    for run_id in ids:
        prefixes.setdefault(run_id[:1], []).append(run_id)
    shared = next(p for p, v in prefixes.items() if len(v) > 1)  # 20 ids, 16 hex digits
    unique = next(
        run_id[:k]
        for run_id in ids
        for k in range(4, len(run_id))
        if sum(o.startswith(run_id[:k]) for o in ids) == 1
    )
    full = next(i for i in ids if i.startswith(unique))

    shown = runner.invoke(app, ["show", unique, "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["id"] == full

    ambiguous = runner.invoke(app, ["show", shared])
    assert ambiguous.exit_code == EXIT_CODES["bad_input"]
    assert "matches" in ambiguous.stderr and "give more characters" in ambiguous.stderr
    assert all(c in ambiguous.stderr for c in prefixes[shared][:10])

    missing = runner.invoke(app, ["cancel", "zz-no-such"])
    assert missing.exit_code == EXIT_CODES["not_found"]
    assert "no run with id 'zz-no-such'" in missing.stderr

    # the other commands resolve the prefix too: a completed run cannot be cancelled
    cancel = runner.invoke(app, ["cancel", unique])
    assert cancel.exit_code == EXIT_CODES["wrong_state"]
    assert full in cancel.stderr


def test_listing_never_reads_a_value_so_a_missing_blob_does_not_break_it(
    env: dict[str, Any],
) -> None:
    ids = _runs([{"n": 1}, {"n": 2}])
    shutil.rmtree(env["tmp"] / "blobs" / "runs" / ids[0])
    runner = CliRunner()
    listing = runner.invoke(app, ["runs", "--json"])
    assert listing.exit_code == 0, listing.output
    rows = [json.loads(line) for line in listing.stdout.splitlines()]
    assert {r["id"] for r in rows} == set(ids)
    assert all(r["status"] == "completed" for r in rows)
    # the run itself says what is missing
    shown = runner.invoke(app, ["show", ids[0]])
    assert shown.exit_code == 1
    assert "not in the blob store" in shown.stderr


def test_show_events_and_steps_gives_the_attempt_history_with_the_traceback(
    env: dict[str, Any],
) -> None:
    [run_id] = _runs([{"fail": True}])
    runner = CliRunner()
    result = runner.invoke(app, ["show", run_id, "--events", "--steps", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["run"]["status"] == "failed"
    attempts = doc["attempts"]
    assert [(a["stage"], a["attempt"], a["outcome"]) for a in attempts] == [
        ("work", 1, "failed"),
        ("work", 2, "failed"),
    ]
    assert attempts[0]["will_retry"] is True and attempts[1]["will_retry"] is False
    assert attempts[0]["error"]["message"] == "first attempt breaks"
    assert attempts[1]["error"]["type"] == "NonRetryableError"
    assert "the second attempt gives up" in attempts[1]["error"]["traceback"]
    assert all(a["started_at"] and a["ended_at"] for a in attempts)
    types = [e["type"] for e in doc["events"]]
    assert types[0] == "run.created" and types[-1] == "run.failed"
    assert doc["steps"] == [
        {"stage": "work", "name": "fetch", "kind": "run", "completed": True, "signal": None}
    ]
    # human output: the attempts table, the traceback, the events and the steps
    human = runner.invoke(app, ["show", run_id[:8], "--events", "--steps"], terminal_width=200)
    assert human.exit_code == 0, human.output
    assert "first attempt breaks" in human.stdout and "stage.failed" in human.stdout


def test_dlq_list_shows_the_dead_letters_that_replay_requeues(env: dict[str, Any]) -> None:
    runner = CliRunner()
    empty = runner.invoke(app, ["dlq", "list", "--json"])
    assert empty.exit_code == EXIT_CODES["unavailable"]  # no tables yet: not initialised
    [run_id] = _runs(
        [{"n": 1}],
        sink=_RefusingSink(),
        dead_letter_after=1,
        outbox_dead_letter_min_seconds=0,
    )
    listing = runner.invoke(app, ["dlq", "list", "--json"])
    assert listing.exit_code == 0, listing.output
    dead = [json.loads(line) for line in listing.stdout.splitlines()]
    assert dead and {d["run_id"] for d in dead} == {run_id}
    assert dead[0]["type"] == "run.created"
    replay = runner.invoke(app, ["dlq", "replay", "--json"])
    assert json.loads(replay.stdout) == {"requeued": len(dead)}
    after = runner.invoke(app, ["dlq", "list", "--json"])
    assert after.exit_code == 0 and after.stdout == ""


def test_a_signal_no_stage_declares_is_refused_as_bad_input(env: dict[str, Any]) -> None:
    async def start() -> str:
        async with create_engine(EngineSettings(), _registry()) as engine:
            return (await engine.start("cli-gate", {})).id

    run_id = asyncio.run(start())
    runner = CliRunner()
    wrong = runner.invoke(app, ["signal", run_id[:10], "aproval", "{}"])
    assert wrong.exit_code == EXIT_CODES["bad_input"], wrong.output
    assert "no stage of its workflow version waits for" in wrong.stderr
    assert "'approval'" in wrong.stderr
    right = runner.invoke(app, ["signal", run_id[:10], "approval", "{}", "--json"])
    assert right.exit_code == 0, right.output
    assert json.loads(right.stdout)["run_id"] == run_id


@pytest.mark.temporal
def test_prefix_ids_and_declared_signals_on_temporal(
    env: dict[str, Any], temporal_server: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    monkeypatch.setenv("WFE_DRIVER", "temporal")
    monkeypatch.setenv("WFE_TEMPORAL_ADDRESS", temporal_server.address)  # type: ignore[attr-defined]
    monkeypatch.setenv("WFE_TASK_QUEUE", f"cli-{uuid.uuid4().hex[:8]}")
    module = f"cli_runs_app_{uuid.uuid4().hex[:8]}"  # a fresh name: imported modules stay
    (env["tmp"] / f"{module}.py").write_text(
        "from tests.integration.test_cli_runs import _registry\nregistry = _registry()\n"
    )

    async def start() -> str:
        async with create_engine(EngineSettings(), _registry()) as engine:
            run_id = (await engine.start("cli-gate", {})).id
            deadline = time.monotonic() + 60
            # the visibility store catches up (slowly on a busy machine)
            while not await engine.list_runs(id_prefix=run_id[:8], outputs=False):
                assert time.monotonic() < deadline, "the run never became visible"
                await asyncio.sleep(0.1)
            return run_id

    run_id = asyncio.run(start())
    runner = CliRunner()
    shown = runner.invoke(app, ["show", run_id[:8], "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["id"] == run_id
    for app_args in (["--app", module], []):
        # without --app too: the graph the run started with (it was queued for ever)
        wrong = runner.invoke(app, ["signal", run_id[:8], "aproval", "{}", *app_args])
        assert wrong.exit_code == EXIT_CODES["bad_input"], (app_args, wrong.output)
        assert "no stage of its workflow version waits for" in wrong.stderr
    # the run's events are read back from its history (TemporalEngine.events), its journaled
    # steps from the BlobStore (TemporalEngine.steps)
    events = runner.invoke(app, ["show", run_id[:8], "--events", "--steps", "--json"])
    assert events.exit_code == 0, events.output
    # (no worker ran it yet: its workflow built no event and journaled no step;
    # test_history_events and test_cli_drivers have the rest)
    assert json.loads(events.stdout)["events"] == []
    assert json.loads(events.stdout)["steps"] == []


def test_version_and_since_are_applied_before_the_limit(env: dict[str, Any]) -> None:
    # ``runs --version X`` kept the runs of X among the ``--limit`` newest runs of any
    # version: in a database of many runs, the older runs of X were never listed
    old = asyncio.run(_start(3))
    _pin_version(env["tmp"] / "wfe.db", old, "v-old")
    asyncio.run(_start(5))
    out = CliRunner().invoke(
        app, ["runs", "--version", "v-old", "--limit", "2", "--json"], catch_exceptions=False
    )
    assert out.exit_code == 0, out.output
    listed = [json.loads(line)["id"] for line in out.output.splitlines() if line.strip()]
    assert listed == list(reversed(old))[:2]
    out = CliRunner().invoke(
        app, ["runs", "--since", "1h", "--limit", "7", "--json"], catch_exceptions=False
    )
    assert out.exit_code == 0, out.output
    assert len([line for line in out.output.splitlines() if line.strip()]) == 7


async def _start(n: int) -> list[str]:
    async with create_engine(EngineSettings(), _registry()) as engine:
        return [(await engine.start("cli-flow", {"n": i})).id for i in range(n)]


def _pin_version(db: Path, run_ids: list[str], version: str) -> None:
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.executemany(
            "UPDATE wfe_runs SET version = ? WHERE id = ?", [(version, r) for r in run_ids]
        )
