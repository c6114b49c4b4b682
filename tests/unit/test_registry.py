"""The explicit Registry: versions of one workflow, conflicts, hook handlers."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import Registry, StageContext, Workflow
from engine_port.errors import (
    DefinitionError,
    DefinitionVersionConflictError,
    EngineError,
    WorkflowNotFoundError,
)


class In(BaseModel):
    n: int = 0


def make(
    wf_id: str = "orders", *, stages: tuple[str, ...] = ("a",), version: str | None = None
) -> Workflow[In]:
    wf = Workflow(wf_id, input=In, version=version, hooks=["order.charged"])
    prev: list[str] = []
    for sid in stages:

        async def body(ctx: StageContext[In]) -> int:
            return 1

        wf.stage(body, id=sid, after=prev)
        prev = [sid]
    return wf


def test_several_versions_of_one_workflow_latest_is_the_last_added() -> None:
    v1 = make(stages=("a",))
    v2 = make(stages=("a", "b"))
    v3 = make(stages=("a", "b", "c"))
    assert len({v1.version, v2.version, v3.version}) == 3
    registry = Registry([v1, v3, v2])
    assert registry.get("orders") is v2
    assert registry.get("orders", "latest") is v2
    assert registry.latest_version("orders") == v2.version
    assert registry.get("orders", v1.version) is v1
    assert registry.get("orders", v3.version) is v3
    assert registry.graph("orders", v3.version) == v3.graph()
    assert registry.served() == {("orders", v.version) for v in (v1, v2, v3)}
    assert registry.has("orders") and registry.has("orders", v1.version)
    assert not registry.has("orders", "nope") and not registry.has("other")
    assert registry.workflow_ids() == ["orders"]
    assert set(map(id, registry.workflows())) == {id(v1), id(v2), id(v3)}


def test_served_lists_every_workflow_and_version() -> None:
    a1, a2 = make("a", version="1"), make("a", stages=("x", "y"), version="2")
    b = make("b")
    registry = Registry([a1, a2, b])
    assert registry.served() == {("a", "1"), ("a", "2"), ("b", b.version)}
    assert Registry().served() == set()


def test_unknown_workflow_or_version_raises_workflow_not_found() -> None:
    registry = Registry([make(version="1")])
    with pytest.raises(WorkflowNotFoundError, match="'missing'") as exc:
        registry.get("missing")
    assert exc.value.workflow_id == "missing" and exc.value.version is None
    with pytest.raises(WorkflowNotFoundError, match="version '9'") as exc:
        registry.get("orders", "9")
    assert exc.value.version == "9"
    with pytest.raises(WorkflowNotFoundError):
        registry.latest_version("missing")
    with pytest.raises(WorkflowNotFoundError):
        registry.graph("missing")


def test_same_explicit_version_with_a_different_structure_conflicts() -> None:
    registry = Registry([make(version="1", stages=("a",))])
    changed = make(version="1", stages=("a", "b"))
    with pytest.raises(DefinitionVersionConflictError, match="new version=") as exc:
        registry.add(changed)
    assert (exc.value.workflow_id, exc.value.version) == ("orders", "1")
    assert isinstance(exc.value, DefinitionError)
    # nothing changed: the original is still what version 1 means
    assert registry.get("orders", "1").stages.keys() == {"a"}


def test_re_adding_the_same_definition_is_not_a_conflict() -> None:
    wf = make(version="1", stages=("a", "b"))
    registry = Registry([wf])
    assert registry.add(wf) is wf
    # an equal definition built again (new function objects, same structure) is fine too
    again = make(version="1", stages=("a", "b"))
    registry.add(again)
    assert registry.get("orders", "1") is again
    assert registry.served() == {("orders", "1")}


def test_two_hashed_versions_never_conflict() -> None:
    registry = Registry([make(stages=("a",)), make(stages=("a", "b"))])
    assert len(registry.served()) == 2


def test_invalid_workflow_is_rejected_and_nothing_is_registered() -> None:
    wf = Workflow("broken", input=In)

    @wf.stage(after=["ghost"])
    async def a(ctx: StageContext[In]) -> int:
        return 1

    registry = Registry()
    with pytest.raises(DefinitionError):
        registry.add(wf)
    assert registry.served() == set()
    with pytest.raises(WorkflowNotFoundError):
        registry.get("broken")


def test_hook_handlers_are_kept_in_registration_order() -> None:
    registry = Registry()

    def second(ctx: Any, payload: Any) -> str:
        return "2"

    def first(ctx: Any, payload: Any) -> str:
        return "1"

    h1 = registry.register_hook("order.charged", second)
    h2 = registry.register_hook("order.charged", first)
    h3 = registry.register_hook("order.charged", lambda c, p: 3, name="third")
    registry.register_hook("other", first)
    handlers = registry.hook_handlers("order.charged")
    assert handlers == [h1, h2, h3]
    assert [h.name for h in handlers] == [second.__qualname__, first.__qualname__, "third"]
    assert [h.fn for h in handlers][:2] == [second, first]
    assert registry.hook_handlers("nobody") == []
    # the returned list is a copy
    handlers.clear()
    assert len(registry.hook_handlers("order.charged")) == 3


def test_duplicate_hook_handler_name_raises() -> None:
    registry = Registry()

    def handler(ctx: Any, payload: Any) -> None:
        return None

    registry.register_hook("order.charged", handler)
    with pytest.raises(DefinitionError, match="name="):
        registry.register_hook("order.charged", handler)
    with pytest.raises(DefinitionError):
        registry.register_hook("order.charged", lambda c, p: None, name=handler.__qualname__)
    # the same name on another hook point is fine
    registry.register_hook("order.shipped", handler)
    registry.register_hook("order.charged", handler, name="again")
    assert len(registry.hook_handlers("order.charged")) == 2


def test_registries_are_independent() -> None:
    one, two = Registry([make("one")]), Registry()
    one.register_hook("order.charged", lambda c, p: None, name="h")
    assert two.served() == set()
    assert two.hook_handlers("order.charged") == []


def test_errors_are_engine_errors() -> None:
    with pytest.raises(EngineError):
        Registry().get("x")


def test_an_unknown_workflow_id_suggests_the_closest_registered_one() -> None:
    wf = Workflow("order-processing", input=_Suggest)

    @wf.stage
    async def a(ctx: StageContext[_Suggest]) -> int:
        return 1

    registry = Registry([wf])
    with pytest.raises(WorkflowNotFoundError, match="did you mean 'order-processing'"):
        registry.get("order-procesing")
    with pytest.raises(WorkflowNotFoundError) as nothing_close:
        registry.get("zzz")
    assert "did you mean" not in str(nothing_close.value)


class _Suggest(BaseModel):
    pass


def test_a_hook_handler_that_cannot_take_ctx_and_payload_is_refused_at_registration() -> None:
    """It failed the stage that ran the hook, at every attempt, on every driver."""
    registry = Registry()

    def one(ctx: Any) -> None: ...

    with pytest.raises(DefinitionError, match=r"must take two arguments \(ctx, payload\)"):
        registry.register_hook("order.charged", one)
    with pytest.raises(DefinitionError, match="must be a function"):
        registry.register_hook("order.charged", "not a function", name="x")  # type: ignore[arg-type]
    assert registry.hook_handlers("order.charged") == []
