"""``wfe conformance``: the contract suite against the configured engine."""

from __future__ import annotations

from typing import Annotated

import typer

from ._errors import reported
from ._options import DriverOpt, JsonOpt, settings
from ._output import console, errors

__all__ = ["conformance_cmd"]


def conformance_cmd(
    driver: DriverOpt = None,
    keyword: Annotated[str | None, typer.Option("-k", help="pytest -k expression")] = None,
    containers: Annotated[
        bool,
        typer.Option(
            "--containers",
            help="run on throwaway PostgreSQL, MinIO and Temporal containers (needs Docker "
            "and the containers extra)",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the conformance suite against the configured engine in a scratch area of its own
    (a temporary SQLite file, its own PostgreSQL schema, or its own Temporal task queues,
    removed afterwards; the configured event sink is not used). Prints a line per scenario
    (stderr), the failures' assertion messages and a summary line."""
    from conformance._cli import run  # pytest and the scenarios: only for this command

    configured = settings(driver)
    try:  # a Temporal container needs the driver's search attributes
        from driver_temporal import SEARCH_ATTRIBUTES

        attributes = list(SEARCH_ATTRIBUTES)
    except ImportError:
        attributes = []
    with reported():
        code = run(
            configured,
            keyword,
            console,
            as_json=as_json,
            progress=errors,
            containers=containers,
            search_attributes=attributes,
        )
    raise typer.Exit(code)
