"""The Temporal dev server the tests start, with room for the suite's Worker Deployments."""

from __future__ import annotations

from typing import Any


def roomy_dev_server(**options: Any) -> Any:
    """A ``TemporalDevServer`` whose namespace takes more than the dev server's default 100
    Worker Deployments (every workflow id the tests register is one deployment; past the
    limit every start fails) and whose deployment read API is not rate-limited."""
    from driver_temporal import TemporalDevServer

    class RoomyDevServer(TemporalDevServer):
        def command(self) -> list[str]:
            return [
                *super().command(),
                "--dynamic-config-value",
                "matching.maxDeployments=100000",
                "--dynamic-config-value",
                "frontend.globalNamespaceWorkerDeploymentReadRPS=10000",
            ]

    return RoomyDevServer(**options)
