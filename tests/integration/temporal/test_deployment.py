"""Worker Deployments as an operator sees them, and Temporal's "try again later" answers."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel
from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest
from temporalio.service import RPCError, RPCStatusCode

from driver_temporal import _rpc
from engine_port import Registry, StageContext, Workflow
from engine_port.errors import DriverUnavailableError

from .conftest import EngineFactory


class In(BaseModel):
    n: int = 0


@pytest.mark.temporal
async def test_a_started_worker_makes_its_version_current(make_engine: EngineFactory) -> None:
    wf = Workflow("deployed", input=In)

    @wf.stage
    async def only(ctx: StageContext[In]) -> str:
        return "v1"

    engine = make_engine(Registry([wf]))
    async with engine:
        version = wf.graph().version
        dv = engine.deployment_version("deployed", version)
        async with engine.worker():
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            current = ""
            while loop.time() < deadline:
                try:
                    desc = await engine._conn.workflow_service.describe_worker_deployment(
                        DescribeWorkerDeploymentRequest(
                            namespace="default", deployment_name=dv.deployment_name
                        )
                    )
                except RPCError:  # no deployment until a worker polled
                    await asyncio.sleep(0.1)
                    continue
                routing = desc.worker_deployment_info.routing_config
                current = routing.current_deployment_version.build_id
                if current:
                    break
                await asyncio.sleep(0.1)
    assert current == version  # not "No Current Version"


async def test_retryable_rpc_errors_are_retried_then_typed() -> None:
    busy = RPCError("too many requests, try again later", RPCStatusCode.RESOURCE_EXHAUSTED, b"")
    answers: list[object] = [busy, RPCError("down", RPCStatusCode.UNAVAILABLE, b""), "ok"]

    async def flaky() -> str:
        a = answers.pop(0)
        if isinstance(a, BaseException):
            raise a
        return str(a)

    assert await _rpc.call("a call", flaky, initial_s=0.001) == "ok"

    async def always_busy() -> str:
        raise busy

    with pytest.raises(DriverUnavailableError, match="kept refusing a call"):
        await _rpc.call("a call", always_busy, deadline_s=0.05, initial_s=0.001)

    async def not_found() -> str:
        raise RPCError("no such run", RPCStatusCode.NOT_FOUND, b"")

    with pytest.raises(RPCError):  # not Temporal's "try again": the caller decides
        await _rpc.call("a call", not_found)


@pytest.mark.temporal
async def test_a_busy_server_while_a_version_registers_is_retried(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RESOURCE_EXHAUSTED from DescribeWorkerDeploymentVersion (what a short client script
    met at start: "too many requests issued to Worker Deployment ...") is retried, not raised
    raw through start()."""
    wf = Workflow("busy-deployment", input=In)

    @wf.stage
    async def only(ctx: StageContext[In]) -> int:
        return ctx.input.n

    engine = make_engine(Registry([wf]))
    async with engine:
        svc = engine._conn.workflow_service
        real = svc.describe_worker_deployment_version
        refusals = [2]

        async def busy_at_first(req: object, *a: object, **kw: object) -> object:
            if refusals[0]:
                refusals[0] -= 1
                raise RPCError(
                    "too many requests issued to Worker Deployment. Please try again later",
                    RPCStatusCode.RESOURCE_EXHAUSTED,
                    b"",
                )
            return await real(req, *a, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(svc, "describe_worker_deployment_version", busy_at_first)
        async with engine.worker():
            run = await engine.start("busy-deployment", {"n": 7})
            assert (await engine.wait(run.id, timeout=30)).output == 7
        assert refusals == [0]
