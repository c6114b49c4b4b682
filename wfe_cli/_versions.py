"""``wfe versions`` and ``wfe drain``: workflow versions and where new runs go."""

from __future__ import annotations

from typing import Annotated

import typer

from engine_port import VersionInfo, create_engine

from ._db import initialised
from ._errors import run_sync
from ._options import AppOpt, DriverOpt, JsonOpt, app_registry, driver_settings, settings
from ._output import console, errors, json_line, rows

__all__ = ["drain_cmd", "versions_cmd"]


def versions_cmd(app_: AppOpt = None, driver: DriverOpt = None, as_json: JsonOpt = False) -> None:
    """Workflow versions: active runs per version, served here, drained (no active run left),
    and where new runs go (new_runs_to: the target of `wfe drain`; None: they start here)."""
    configured = settings(driver)
    initialised(configured)
    registry = app_registry(app_, configured, required=False)

    async def versions() -> list[VersionInfo]:
        async with create_engine(configured, registry) as engine:
            return await engine.list_versions()

    found = run_sync(versions())
    if as_json:
        for v in found:
            json_line(v)
        return
    rows(
        tuple(VersionInfo.model_fields),  # (also with no version yet: the same header)
        [tuple(str(x) for x in v.model_dump(mode="json").values()) for v in found],
    )


def drain_cmd(
    workflows: Annotated[list[str], typer.Argument(help="workflow ids")],
    target: Annotated[
        str | None, typer.Option(help="where new runs go instead (named in the error)")
    ] = None,
    lift: Annotated[bool, typer.Option("--lift", help="take new runs here again")] = False,
    driver: DriverOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop taking new runs of these workflows here (start() then raises WorkflowDrainedError),
    or lift the drain with --lift."""
    if lift and target:
        raise typer.BadParameter("give --target or --lift, not both", param_hint="--lift")
    if not lift and not target:
        raise typer.BadParameter(
            "say where new runs go (--target temporal, --target native) or --lift the drain",
            param_hint="--target",
        )
    configured = settings(driver)
    if target is not None:
        # a misspelt target drained the workflow towards nothing (new runs refused for good)
        named = driver_settings(target, "--target").driver
        if named == configured.driver:
            raise typer.BadParameter(
                f"new runs of these workflows already start on {named}; name the driver they "
                "should go to instead",
                param_hint="--target",
            )
    initialised(configured)  # a drain in the wrong folder created an empty database there

    async def drain() -> tuple[set[str], set[str]]:
        async with create_engine(configured, None) as engine:
            # (before a lift: which of the workflows were drained, by ``new_runs_to``)
            before = await engine.list_versions() if lift else []
            await engine.drain(workflows, None if lift else target)
            drained = {v.workflow_id for v in before if v.new_runs_to is not None}
            return {v.workflow_id for v in await engine.list_versions()}, drained

    known, was_drained = run_sync(drain())
    unknown = [w for w in workflows if w not in known]
    if unknown and not lift:
        errors.print(
            f"note: no run of {', '.join(map(repr, unknown))} is known here; check the "
            "workflow id (the drain applies to runs started from now on)",
            highlight=False,
            soft_wrap=True,
        )
    if not lift:
        if as_json:
            json_line({"workflows": workflows, "drained": True, "target": target})
        else:
            console.print(
                f"drained (new runs go to {target}): {', '.join(workflows)}", highlight=False
            )
        return
    # a lift: say which workflows were not drained (nothing to lift); one no version of which
    # is known here (``list_versions`` lists versions, not drains) may have been drained
    lifted = [w for w in workflows if w in was_drained]
    idle = [w for w in workflows if w in known and w not in was_drained]
    unsure = [w for w in workflows if w not in known and w not in was_drained]
    if as_json:
        json_line(
            {
                "workflows": workflows,
                "drained": False,
                "target": None,
                "lifted": lifted,
                "not_drained": idle,
            }
        )
        return
    if lifted:
        console.print(f"lifted the drain of {', '.join(lifted)}", highlight=False)
    if idle:
        console.print(
            f"{', '.join(idle)}: not drained, nothing to lift (new runs already start here)",
            highlight=False,
        )
    if unsure:
        console.print(
            f"lifted the drain of {', '.join(unsure)}, if any (no run of "
            f"{'it' if len(unsure) == 1 else 'them'} is known here)",
            highlight=False,
        )
