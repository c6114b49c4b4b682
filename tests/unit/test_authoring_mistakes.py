"""Workflow definitions written wrongly, as a new user writes them: each is a DefinitionError
that says what to do, raised where the mistake is made, never an AttributeError from inside
the registry or a run that never finds its version."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from engine_port import Registry, StageContext, Workflow
from engine_port._clock import SystemClock
from engine_port._context import Steps
from engine_port._ledger import InMemoryLedger
from engine_port.errors import DefinitionError, StepError


class In(BaseModel):
    n: int = 0


def one_stage(wf_id: str = "w", **kwargs: Any) -> Workflow[In]:
    wf = Workflow(wf_id, input=In, **kwargs)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    return wf


@pytest.mark.parametrize("item", ["orders", 42, None])
def test_a_registry_of_something_else_than_workflows_is_a_definition_error(item: Any) -> None:
    with pytest.raises(DefinitionError, match="holds Workflow objects, not"):
        Registry([item])
    with pytest.raises(DefinitionError, match="holds Workflow objects"):
        Registry().add(item)


def test_a_registry_takes_one_workflow_without_a_list_and_refuses_other_values() -> None:
    wf = one_stage()
    assert Registry(wf).get("w") is wf  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match=r"takes a list of workflows.*Registry\(\[wf1"):
        Registry(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [None, "v1"])
def test_a_stage_declared_after_the_workflow_was_registered_is_refused(
    version: str | None,
) -> None:
    # before: with the structural hash, start("w") said "no workflow 'w' version ... is
    # registered; add it to the Registry" (it was); with version= the registered v1 changed
    # under the registry without its conflict check
    wf = one_stage(version=version)
    registry = Registry([wf])
    before = wf.version
    with pytest.raises(DefinitionError, match=r"already in a Registry.*before Registry"):

        @wf.stage(after=["a"])
        async def b(ctx: StageContext[In]) -> int:
            return 2

    assert wf.version == before and registry.get("w", before) is wf
    assert list(wf.stages) == ["a"]


def test_a_compensation_or_hook_point_declared_after_registration_is_refused() -> None:
    wf = Workflow("w", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    Registry([wf])
    with pytest.raises(DefinitionError, match=r"compensation of stage 'a'.*already in a Registry"):

        @a.compensation
        async def undo(ctx: StageContext[In], output: int) -> None: ...

    with pytest.raises(DefinitionError, match=r"hook point 'h'.*already in a Registry"):
        wf.hook_point("h")
    assert a.compensation_fn is None and wf.hooks == ()


def test_one_workflow_may_be_added_to_several_registries() -> None:
    wf = one_stage()
    assert Registry([wf]).get("w") is Registry([wf]).get("w") is wf


def test_one_hook_point_given_as_a_string_is_one_name_not_its_letters() -> None:
    wf = Workflow("w", input=In, hooks="order.charged")
    assert wf.hooks == ("order.charged",)


@pytest.mark.parametrize("dep", [42, None, 1.5])
def test_after_with_a_value_that_is_no_stage_says_what_after_takes(dep: Any) -> None:
    wf = Workflow("w", input=In)
    with pytest.raises(DefinitionError, match=r"after= takes the stages returned by @wf.stage"):
        wf.stage(lambda ctx: 1, id="b", after=[dep])


def test_after_with_an_undecorated_function_says_to_decorate_it() -> None:
    wf = Workflow("w", input=In)

    async def a(ctx: StageContext[In]) -> int:  # forgot @wf.stage
        return 1

    with pytest.raises(DefinitionError, match=r"not function .*decorate the function"):

        @wf.stage(after=[a])  # type: ignore[list-item]
        async def b(ctx: StageContext[In]) -> int:
            return 2


@pytest.mark.parametrize("local", ["yes", 1, None])
def test_local_must_be_a_bool(local: Any) -> None:
    wf = Workflow("w", input=In)
    with pytest.raises(DefinitionError, match="local= must be True or False"):
        wf.stage(lambda ctx: 1, id="a", local=local)


async def test_steps_and_events_of_a_closed_attempt_are_refused() -> None:
    # the runner closes ctx.step when the attempt ends (see engine_port._runner): a task the
    # body started and left running then gets a StepError naming the mistake, where it got a
    # driver's CancelledError ("the lease ... is gone", native) or journaled into an attempt
    # that was over, lost without a word (Temporal)
    ledger = InMemoryLedger()
    steps = Steps(ledger, SystemClock())
    assert await steps.run("before", lambda: 1) == 1
    steps.close()
    calls: list[Coroutine[Any, Any, Any]] = [
        steps.run("late", lambda: 2),
        steps.sleep("nap", 1),
        steps.wait_for_signal("go"),
        steps.wait_for("poll", lambda: True),
    ]
    for call in calls:
        with pytest.raises(StepError, match=r"after its stage attempt ended.*await the tasks"):
            await call
    assert [r.name for r in ledger.written] == ["before"]

    wf = one_stage()
    wf.hook_point("h")
    ctx = StageContext(
        input=In(),
        run_id="r",
        stage_id="a",
        attempt=1,
        workflow=wf,
        step=steps,
        registry=Registry([wf]),
    )
    with pytest.raises(StepError, match=r"ctx.emit\('order.done'\) was called after"):
        ctx.emit("order.done", {})
    with pytest.raises(StepError, match=r"ctx.hook\('h'\) was called after"):
        await ctx.hook("h", {})
    assert ctx.events == []


@pytest.mark.parametrize(
    ("value", "keys"),
    [
        ({1: "a", "1": "b"}, "1 and '1'"),
        ({"x": [{True: 1, "true": 2}]}, "True and 'true'"),
        ({None: 1, "None": 2}, "None and 'None'"),
    ],
)
def test_a_dict_whose_keys_collide_in_json_is_refused(value: Any, keys: str) -> None:
    # before: {1: "a", "1": "b"} became {"1": "b"}, the other value dropped without a word
    from engine_port._serde import to_json_value
    from engine_port.errors import SerializationError

    with pytest.raises(SerializationError, match=rf"has the keys {keys}.*distinct string keys"):
        to_json_value(value, "output of stage 'a'")


def test_dicts_with_non_string_keys_that_do_not_collide_still_serialise() -> None:
    from engine_port._serde import to_json_value

    assert to_json_value({1: "a", 2: {3: [4]}}, "x") == {"1": "a", "2": {"3": [4]}}


class Opaque:
    pass


class OpaqueIn(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    handle: Opaque | None = None


class CallbackIn(BaseModel):
    callback: Callable[[], int] | None = None


@pytest.mark.parametrize("model", [OpaqueIn, CallbackIn])
def test_an_input_model_with_no_json_form_is_a_definition_error(model: type[BaseModel]) -> None:
    # before: pydantic's PydanticInvalidForJsonSchema escaped from Registry([...])
    wf = Workflow("w", input=model)
    wf.stage(lambda ctx: 1, id="a")
    with pytest.raises(DefinitionError, match=rf"input model {model.__name__} cannot be desc"):
        Registry([wf])
