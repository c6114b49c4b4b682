"""The explicit registry of workflows and hook handlers (no global state)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ._graph import GraphModel, Workflow, check_handler
from ._limits import check_hook_name, definition_error
from .errors import DefinitionError, DefinitionVersionConflictError, WorkflowNotFoundError

__all__ = ["HookHandler", "Registry"]


@dataclass(frozen=True)
class HookHandler:
    hook: str
    name: str
    fn: Callable[..., Any]


class Registry:
    """Holds workflow definitions (several versions per id allowed) and hook handlers.

    The last version added for a workflow id is its ``latest``.
    """

    def __init__(self, workflows: Iterable[Workflow[Any]] = ()) -> None:
        self._workflows: dict[str, dict[str, Workflow[Any]]] = {}
        self._hooks: dict[str, list[HookHandler]] = {}
        if isinstance(workflows, Workflow):  # one workflow given without a list
            workflows = [workflows]
        elif not isinstance(workflows, Iterable) or isinstance(workflows, str | bytes):
            raise DefinitionError(
                f"Registry() takes a list of workflows, not {type(workflows).__name__}; "
                "write Registry([wf1, wf2])"
            )
        for wf in workflows:
            self.add(wf)

    def add(self, workflow: Workflow[Any]) -> Workflow[Any]:
        if not isinstance(workflow, Workflow):
            raise DefinitionError(
                f"a Registry holds Workflow objects, not {type(workflow).__name__} "
                f"({workflow!r:.80}); pass the Workflow(...) your stages were declared on"
            )
        graph = workflow.graph()  # validates: cycles, unknown deps, empty
        versions = self._workflows.setdefault(workflow.id, {})
        existing = versions.get(graph.version)
        if (
            existing is not None
            and existing is not workflow
            and existing.graph().canonical_json() != graph.canonical_json()
        ):
            raise DefinitionVersionConflictError(workflow.id, graph.version)
        versions.pop(graph.version, None)
        versions[graph.version] = workflow
        workflow._registered = True  # its structure is now fixed (see Workflow._mutable)
        return workflow

    def register_hook(
        self, hook: str, fn: Callable[..., Any], *, name: str | None = None
    ) -> HookHandler:
        """Register ``fn(ctx, payload)`` for hook point ``hook``; handlers run in this order."""
        handler_name = name or getattr(fn, "__qualname__", None) or repr(fn)
        check_hook_name(hook, error=definition_error)
        check_hook_name(handler_name, "hook handler name", error=definition_error)
        if not callable(fn):
            raise DefinitionError(f"the handler of hook {hook!r} must be a function")
        check_handler(fn, f"hook handler {handler_name!r}", "two arguments (ctx, payload)", 2)
        handlers = self._hooks.setdefault(hook, [])
        if any(h.name == handler_name for h in handlers):
            raise DefinitionError(
                f"a handler named {handler_name!r} is already registered for hook {hook!r}; "
                "pass name= to tell them apart"
            )
        h = HookHandler(hook, handler_name, fn)
        handlers.append(h)
        return h

    def hook_handlers(self, hook: str) -> list[HookHandler]:
        return list(self._hooks.get(hook, ()))

    def get(self, workflow_id: str, version: str | None = None) -> Workflow[Any]:
        versions = self._workflows.get(workflow_id)
        if not versions:
            close = difflib.get_close_matches(str(workflow_id), list(self._workflows), n=1)
            raise WorkflowNotFoundError(workflow_id, did_you_mean=close[0] if close else None)
        if version is None or version == "latest":
            return next(reversed(versions.values()))
        try:
            return versions[version]
        except KeyError:
            raise WorkflowNotFoundError(workflow_id, version) from None

    def has(self, workflow_id: str, version: str | None = None) -> bool:
        versions = self._workflows.get(workflow_id, {})
        return bool(versions) if version is None else version in versions

    def latest_version(self, workflow_id: str) -> str:
        return self.get(workflow_id).version

    def graph(self, workflow_id: str, version: str | None = None) -> GraphModel:
        return self.get(workflow_id, version).graph()

    def served(self) -> set[tuple[str, str]]:
        """The (workflow id, version) pairs this registry serves."""
        return {(wid, v) for wid, vs in self._workflows.items() for v in vs}

    def workflows(self) -> list[Workflow[Any]]:
        return [wf for vs in self._workflows.values() for wf in vs.values()]

    def workflow_ids(self) -> list[str]:
        return list(self._workflows)
