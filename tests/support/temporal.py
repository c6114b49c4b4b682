"""The Temporal dev server the tests start, with room for the suite's Worker Deployments."""

from __future__ import annotations

from typing import Any


def roomy_dev_server(**options: Any) -> Any:
    """A ``TemporalDevServer`` whose namespace takes more than the dev server's default 100
    Worker Deployments (every workflow id the tests register is one deployment; past the
    limit every start fails), whose deployment read API is not rate-limited, and whose timers
    fire when due: by default the server's timer queue looks up to a second ahead
    (``history.timerProcessorMaxTimeShift``), and a 20-600 ms timer fired 0.4-1.0 s late
    (``asyncio.sleep`` in a hand-written workflow, measured 2026-12-07); at 10 ms, 30-100 ms
    late. The suite's retries, sleeps and timeouts are short: each cost about a second."""
    from driver_temporal import TemporalDevServer

    class RoomyDevServer(TemporalDevServer):
        def command(self) -> list[str]:
            return [
                *super().command(),
                "--dynamic-config-value",
                "matching.maxDeployments=100000",
                "--dynamic-config-value",
                "frontend.globalNamespaceWorkerDeploymentReadRPS=10000",
                "--dynamic-config-value",
                'history.timerProcessorMaxTimeShift="10ms"',
            ]

    return RoomyDevServer(**options)
