"""What a transition needs to know about a graph, each answer in time independent of its size.

``GraphModel.stage`` and ``GraphModel.sinks`` walk every stage: fine once per run, not once per
stage transition of a 10,000-stage graph. A ``GraphShape`` indexes a graph once (the kernel
keeps one per served version) and answers by dictionary lookups.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine_port import GraphModel, StageSpec

__all__ = ["GraphShape"]

WANTED_KEPT = 100_000
"""Stage ids a shape keeps in its answers of :meth:`GraphShape.wanted` at most (a long
chain's groups each want their whole upstream: past that, answers are made anew)."""


class GraphShape:
    """A read-only index of one graph: stages by id, sinks, and each stage's upstream."""

    __slots__ = ("_by_id", "_group_of", "_kept", "_sinks", "_wanted", "graph")

    def __init__(self, graph: GraphModel) -> None:
        self.graph = graph
        self._by_id = {s.id: s for s in graph.stages}
        used = {d for s in graph.stages for d in s.after}
        self._sinks = tuple(s.id for s in graph.stages if s.id not in used)
        self._group_of = {sid: i for i, ids in enumerate(graph.groups) for sid in ids}
        self._wanted: dict[tuple[int, int], frozenset[str]] = {}
        self._kept = 0  # stage ids in ``_wanted``

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

    def wanted(self, group: int, limit: int) -> frozenset[str]:
        """The stage rows scheduling ``group`` reads: its stages, what the first ``limit`` of
        them (by id: the stages it may hand off) may read (their upstream), and the sinks
        when it is the last group (to finish). Made once per group and limit (every
        transition of every run of the graph asks), up to ``WANTED_KEPT`` ids kept."""
        found = self._wanted.get((group, limit))
        if found is not None:
            return found
        ids = self.graph.groups[group]
        want = set(ids)
        if limit > 0:
            want |= self.upstream(sorted(ids)[:limit])
        if group == len(self.graph.groups) - 1:
            want.update(self._sinks)
        found = frozenset(want)
        if self._kept + len(found) <= WANTED_KEPT:
            self._wanted[(group, limit)] = found
            self._kept += len(found)
        return found
