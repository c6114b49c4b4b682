"""What a workflow author uses: a graph of stages (``Workflow``, ``Stage``), their retry
policy, the stage context with its durable steps, and the registry a workflow module exports.

Every name here is also importable from ``engine_port``: ``from engine_port import Workflow``.
"""

from ._context import StageContext, Steps, SyncSteps
from ._graph import GraphModel, Retry, Stage, StageSpec, Workflow
from ._registry import Registry
from .errors import NonRetryableError

__all__ = [
    "GraphModel",
    "NonRetryableError",
    "Registry",
    "Retry",
    "Stage",
    "StageContext",
    "StageSpec",
    "Steps",
    "SyncSteps",
    "Workflow",
]
