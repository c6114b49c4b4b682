"""Which signal names a run accepts: the ones its workflow version's stages declare."""

from __future__ import annotations

from ._graph import GraphModel
from ._registry import Registry
from .errors import UnknownSignalError

__all__ = ["check_signal_known", "served_graph"]


def declared_signals(graph: GraphModel) -> list[str]:
    return sorted({name for stage in graph.stages for name in stage.signals})


def check_signal_known(graph: GraphModel | None, run_id: str, name: str) -> None:
    """Refuse a signal no stage of the run's version waits for (UnknownSignalError). Every
    name is accepted when the version declares no signals, or its graph is not known here."""
    if graph is None:
        return
    known = declared_signals(graph)
    if known and name not in known:
        raise UnknownSignalError(run_id, name, known)


def served_graph(registry: Registry | None, workflow_id: str, version: str) -> GraphModel | None:
    """The graph of (workflow, version) when ``registry`` serves it, else None."""
    if registry is None or not registry.has(workflow_id, version):
        return None
    return registry.graph(workflow_id, version)
