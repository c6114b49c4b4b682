"""``wfe conformance``: the contract suite against the configured engine."""

from __future__ import annotations

from typing import Annotated

import typer

from ._errors import EXIT_CODES, reported
from ._options import DriverOpt, JsonOpt, settings
from ._output import console, error_line, errors

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
    raise typer.Exit(_exit_code(code))


def _exit_code(pytest_code: int) -> int:
    """The suite's pytest exit code as wfe's: pytest's own numbers said "wrong usage" (2) for
    Ctrl-C, "wrong state" (4) for a malformed -k and "unavailable" (5) for a -k that matches
    no scenario."""
    if pytest_code == 2:  # pytest.ExitCode.INTERRUPTED
        error_line("interrupted; the summary counts only the scenarios that ran")
        return EXIT_CODES["interrupted"]
    if pytest_code == 4:  # USAGE_ERROR: a -k expression pytest cannot parse
        error_line("the -k expression is malformed; e.g. -k 's1_linear or signals'")
        return 2
    if pytest_code == 5:  # NO_TESTS_COLLECTED
        error_line("no scenario matches -k; run without -k to list them all")
        return EXIT_CODES["bad_input"]
    return 0 if pytest_code == 0 else 1
