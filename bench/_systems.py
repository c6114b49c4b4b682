"""The systems under test and how one of them is run (in its own process)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ._common import Sizes

__all__ = ["SYSTEMS", "System"]


@dataclass(frozen=True)
class System:
    name: str
    label: str
    group: str  # sqlite | postgres | temporal: ratios compare within a group
    slow: bool = False  # fewer samples for the per-run workloads
    latency_only: bool = False
    # both sides of a comparison in one process, samples alternated (its own table)
    paired: bool = False


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in [
        System("native-sqlite", "native driver, SQLite", "sqlite"),
        System("dbos-sqlite", "DBOS Transact, SQLite", "sqlite"),
        System("floor-sqlite", "raw floor, sqlite3", "sqlite"),
        System("native-postgres", "native driver, PostgreSQL", "postgres"),
        System("dbos-postgres", "DBOS Transact, PostgreSQL", "postgres"),
        System("floor-postgres", "raw floor, psycopg", "postgres"),
        System("temporal-driver", "Temporal driver (activities)", "temporal", slow=True),
        System(
            "temporal-driver-local",
            "Temporal driver, local=True stages",
            "temporal",
            slow=True,
            latency_only=True,
        ),
        System("temporal-raw", "hand-written temporalio", "temporal", slow=True),
        System(
            "temporal-paired",
            "Temporal driver and hand-written temporalio, paired",
            "temporal",
            slow=True,
            paired=True,
        ),
        System(
            "temporal-raw-local",
            "hand-written temporalio, local activities",
            "temporal",
            slow=True,
            latency_only=True,
        ),
    ]
}

REFERENCE = {
    "sqlite": "native-sqlite",
    "postgres": "native-postgres",
    "temporal": "temporal-driver",
}


def _runner(name: str) -> Callable[[Sizes], Coroutine[Any, Any, dict[str, Any]]]:
    kind, _, variant = name.partition("-")
    if kind == "native":
        from ._native import run_native

        return lambda s: run_native(variant, s)
    if kind == "dbos":
        from ._dbos import run_dbos

        return lambda s: run_dbos(variant, s)
    if kind == "floor":
        from ._floor import run_floor

        return lambda s: run_floor(variant, s)
    if variant == "paired":
        from ._temporal_paired import run_temporal_paired

        return run_temporal_paired
    from ._temporal import run_temporal_driver, run_temporal_raw

    fn = run_temporal_driver if variant.startswith("driver") else run_temporal_raw
    local = variant.endswith("local")
    return lambda s: fn(s, local=local)


def sizes_for(system: System, quick: bool) -> Sizes:
    return Sizes.quick() if quick else Sizes.full(slow=system.slow)


def run_one(name: str, quick: bool) -> dict[str, Any]:
    """Run every workload of one system in this process."""
    system = SYSTEMS[name]
    sizes = sizes_for(system, quick)
    return asyncio.run(_runner(name)(sizes))


def main() -> None:
    """``python -m bench._systems NAME quick|full OUT.json`` (used by the orchestrator)."""
    name, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
    result = run_one(name, mode == "quick")
    with open(out, "w") as f:
        json.dump(result, f, default=str)


if __name__ == "__main__":
    main()
