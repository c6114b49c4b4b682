"""An operator's reset of a run (the Web UI's "Reset" to a run's first workflow task), of its
first execution or of one it continued as new in: the new execution starts from the state at
that point, each stage it runs again replays its step journal (keyed by the engine's run id),
so a step journaled before the reset is not run again, and each signal Temporal re-applies
after the reset point is taken once: by the journaled wait that took it before the reset, or
by a later wait; each wait's ``stage.suspended`` keeps one id. Until 2026-12-06 a reset of
a continued execution was not seen as a reset (its journaled steps ran again), and after any
reset the re-applied signals were taken a second time by later waits."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest

from engine_port import MemorySink, Registry, RunStatus, StageContext, Workflow

from .conftest import EngineFactory
from .test_continue_as_new import Calls, In, executions, until

pytestmark = pytest.mark.temporal

LOW = 100
SIGNALS = 30


def reset_workflow(calls: Calls, local: bool = False) -> Workflow[In]:
    wf = Workflow(f"can-reset-{time.monotonic_ns()}", input=In, version="v1")

    @wf.stage(signals=["go"], local=local)
    async def s(ctx: StageContext[In]) -> dict[str, Any]:
        await ctx.step.run("charge", lambda: calls.hit("charge"))
        got = []
        for i in range(SIGNALS):
            got.append(int((await ctx.step.wait_for_signal("go", timeout=600))["v"]))
            await ctx.step.run(f"after-{i}", lambda k=i: calls.hit(f"after-{k}"))
        return {"got": got}

    return wf


@pytest.mark.parametrize(
    ("continues", "local"),
    [(True, False), (False, False), (True, True), (False, True)],
    ids=["continued", "first-execution", "continued-local", "first-execution-local"],
)
async def test_a_reset_runs_no_step_again_and_takes_each_signal_once(
    make_engine: EngineFactory, continues: bool, local: bool
) -> None:
    calls = Calls()
    wf = reset_workflow(calls, local)
    sink = MemorySink()
    options = {"continue_as_new_events": LOW} if continues else {}
    engine = make_engine(Registry([wf]), sink=sink, options=options)
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            reset_after: int | None = None
            seen_at_reset = 0  # the distinct suspensions the sink had when the reset came
            for i in range(SIGNALS):
                await wait_number(engine, run.id, "go", i)
                if reset_after is None and (
                    len(await executions(engine, run.id)) > 1 if continues else i == 5
                ):
                    reset_after = i + 3  # three waits and steps journaled before the reset
                if i == reset_after:
                    seen_at_reset = len(_suspensions(sink, run.id))
                    await _reset_latest(engine, run.id)
                await engine.signal(run.id, "go", {"v": i})
            done = await engine.wait(run.id, timeout=120)
    assert reset_after is not None and reset_after < SIGNALS, (
        "the run never continued as new"
    )  # (continued)
    assert done.status == RunStatus.COMPLETED, done
    assert done.output == {"got": list(range(SIGNALS))}
    assert calls.counts == {"charge": 1, **{f"after-{i}": 1 for i in range(SIGNALS)}}
    # each wait suspended with its own deadline: a consumer that drops repeated ids sees
    # each of them once (the waits a reset replays from the journal re-emit their event with
    # its id; until 2026-12-06 the later waits were numbered anew from the reset point and
    # took the ids of waits delivered before it). One may be missing: the wait the reset
    # came in may take its signal without suspending again, while its suspension before the
    # reset, in the history the reset discarded, was not delivered yet (on a loaded host the
    # sink may lag more than one wait behind: what it had at the reset is kept, and every
    # wait after the reset point has its own suspension).
    suspended = _suspensions(sink, run.id)
    assert all(len(u) == 1 for u in suspended.values()), suspended
    assert len(suspended) >= seen_at_reset + SIGNALS - 1 - reset_after


def _suspensions(sink: MemorySink, run_id: str) -> dict[str, set[Any]]:
    """The run's stage.suspended events by id: each id's deadlines."""
    suspended: dict[str, set[Any]] = {}
    for e in sink.events:
        if e.run_id == run_id and e.type == "stage.suspended":
            suspended.setdefault(e.id, set()).add(e.data["until"])
    return suspended


async def wait_number(engine: Any, run_id: str, name: str, k: int) -> None:
    """Until the run's one stage waits for ``name`` with ``k`` signal waits taken before."""

    async def waiting() -> bool:
        info = await engine.get_run(run_id)
        if info.stages[0].waiting_for != f"signal:{name}":
            return False
        steps = await engine.steps(run_id)
        return sum(1 for st in steps if st.kind == "signal" and st.completed) == k

    await until(f"the wait for signal {k}", waiting)


async def _reset_latest(engine: Any, run_id: str) -> None:
    """Reset the run's latest execution to the end of its first workflow task."""
    handle = engine._conn.get_workflow_handle(run_id)
    history = await handle.fetch_history()
    first = next(
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    await engine._conn.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace="default",
            workflow_execution=WorkflowExecution(workflow_id=run_id),
            reason="operator reset",
            workflow_task_finish_event_id=first.event_id,
            request_id=uuid.uuid4().hex,
        )
    )
