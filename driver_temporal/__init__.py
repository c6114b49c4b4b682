"""The Temporal driver: the same workflow graph executed by a Temporal cluster.

Stages are activities (type = stage id) of a dynamic workflow (type = workflow id); signals are
Temporal signals and updates; each definition version is a Worker Deployment version (build id)
and every run is PINNED to its own, so a run only executes on workers serving its version; runs
are inspectable in the Temporal Web UI. Nothing from ``temporalio`` crosses this package's API:
users see port models and ``engine_port.errors`` only.
"""

from ._devserver import TemporalDevServer, find_temporal_binary, run_dev_server
from ._engine import TemporalEngine, create_temporal_engine
from ._search import SEARCH_ATTRIBUTES
from ._worker import EngineWorker, run_worker_forever

__all__ = [
    "SEARCH_ATTRIBUTES",
    "EngineWorker",
    "TemporalDevServer",
    "TemporalEngine",
    "create_temporal_engine",
    "find_temporal_binary",
    "run_dev_server",
    "run_worker_forever",
]
