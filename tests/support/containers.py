"""``pytest --containers``: the session's PostgreSQL, MinIO and Temporal dev server come from
container images (conformance._containers) instead of the local servers. The fixtures read
where they are from ``WFE_TEST_*`` variables set here for the whole session."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import pytest

from conformance._containers import choose_servers, started_containers
from engine_port.errors import EngineError


@dataclass(frozen=True)
class ContainerTemporal:
    """What the tests use of a dev server: its address."""

    address: str


def start_for_session(config: pytest.Config) -> None:
    """Start the containers when ``--containers`` is given (and stop them at the end)."""
    try:
        if choose_servers(bool(config.getoption("--containers"))) == "local":
            return
    except EngineError as exc:
        raise pytest.UsageError(str(exc)) from None
    from driver_temporal import SEARCH_ATTRIBUTES

    stack = contextlib.ExitStack()
    servers = stack.enter_context(started_containers(search_attributes=SEARCH_ATTRIBUTES))
    saved = {k: os.environ.get(k) for k in servers.test_env()}
    os.environ.update(servers.test_env())
    stack.callback(_restore, saved)
    config.add_cleanup(stack.close)


def _restore(saved: dict[str, str | None]) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
