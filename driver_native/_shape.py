"""What a transition needs to know about a graph, each answer in time independent of its size.

``GraphModel.stage`` and ``GraphModel.sinks`` walk every stage: fine once per run, not once per
stage transition of a 10,000-stage graph. A ``GraphShape`` indexes a graph once (the kernel
keeps one per served version) and answers by dictionary lookups.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine_port import GraphModel, StageSpec

__all__ = ["GraphShape"]


class GraphShape:
    """A read-only index of one graph: stages by id, sinks, and each stage's upstream."""

    __slots__ = ("_by_id", "_group_of", "_sinks", "graph")

    def __init__(self, graph: GraphModel) -> None:
        self.graph = graph
        self._by_id = {s.id: s for s in graph.stages}
        used = {d for s in graph.stages for d in s.after}
        self._sinks = tuple(s.id for s in graph.stages if s.id not in used)
        self._group_of = {sid: i for i, ids in enumerate(graph.groups) for sid in ids}

    @property
    def groups(self) -> list[list[str]]:
        return self.graph.groups

    def stage(self, stage_id: str) -> StageSpec:
        try:
            return self._by_id[stage_id]
        except KeyError:
            return self.graph.stage(stage_id)  # raises the port's DefinitionError

    def group_of(self, stage_id: str) -> int | None:
        """The index of the execution group ``stage_id`` belongs to (None: not a stage)."""
        return self._group_of.get(stage_id)

    def sinks(self) -> list[str]:
        return list(self._sinks)

    def upstream(self, stage_ids: Iterable[str]) -> set[str]:
        """Every stage the given stages come after, directly or transitively: the outputs a
        stage may read with ``ctx.output_of`` (as on the Temporal driver). Linear in the
        answer, not in the graph."""
        seen: set[str] = set()
        todo = [d for sid in stage_ids for d in self._by_id[sid].after]
        while todo:
            d = todo.pop()
            if d not in seen:
                seen.add(d)
                todo.extend(self._by_id[d].after)
        return seen
