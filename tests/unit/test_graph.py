"""The graph format: execution groups, definition errors, version hashes, canonical JSON."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import GraphModel, Registry, Retry, StageContext, Workflow
from engine_port.errors import DefinitionError, InvalidRedriveError, NonRetryableError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


class In(BaseModel):
    n: int = 0


class OtherIn(BaseModel):
    n: int = 0
    name: str = ""


class Out(BaseModel):
    value: int


class OtherOut(BaseModel):
    value: str


def chain(wf: Workflow[Any], deps: dict[str, list[str]]) -> Workflow[Any]:
    """Add stages ``id -> after`` (string ids) to ``wf`` with trivial bodies."""
    for sid, after in deps.items():

        async def body(ctx: StageContext[Any]) -> int:
            return 1

        wf.stage(body, id=sid, after=after)
    return wf


# -- execution groups ------------------------------------------------------------------------


def test_groups_of_a_linear_chain_are_one_stage_each() -> None:
    wf = chain(Workflow("linear", input=In), {"a": [], "b": ["a"], "c": ["b"]})
    assert wf.groups() == [["a"], ["b"], ["c"]]
    assert wf.graph().groups == [["a"], ["b"], ["c"]]


def test_groups_of_a_diamond_put_the_middle_stages_in_one_group() -> None:
    wf = chain(Workflow("diamond", input=In), {"a": [], "c": ["a"], "b": ["a"], "d": ["b", "c"]})
    assert wf.groups() == [["a"], ["b", "c"], ["d"]]
    g = wf.graph()
    assert g.sinks() == ["d"]
    assert g.group_of("c") == 1
    assert g.stage("d").after == ["b", "c"]


def test_independent_roots_share_the_first_group() -> None:
    wf = chain(Workflow("roots", input=In), {"y": [], "x": [], "z": ["x"], "w": ["z", "y"]})
    assert wf.groups() == [["x", "y"], ["z"], ["w"]]


def test_a_stage_is_placed_after_its_deepest_dependency() -> None:
    wf = chain(Workflow("deep", input=In), {"a": [], "b": ["a"], "c": ["b"], "d": ["a", "c"]})
    assert wf.groups() == [["a"], ["b"], ["c"], ["d"]]


def test_dependencies_by_string_id_may_name_a_stage_defined_later() -> None:
    wf = chain(Workflow("forward", input=In), {"b": ["a"], "a": []})
    assert wf.groups() == [["a"], ["b"]]


def test_after_accepts_stage_objects() -> None:
    wf = Workflow("objs", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> int:
        return 2

    @wf.stage(after=a)  # type: ignore[call-overload,untyped-decorator]  # one dependency without a list
    async def c(ctx: StageContext[In]) -> int:
        return 3

    assert wf.groups() == [["a"], ["b", "c"]]
    assert wf.get_stage("c").after == ("a",)


# -- definition errors -----------------------------------------------------------------------


def test_cycle_via_string_ids_raises_at_graph_and_at_registry_add() -> None:
    wf = chain(Workflow("cyclic", input=In), {"a": ["c"], "b": ["a"], "c": ["b"], "d": []})
    with pytest.raises(DefinitionError, match="cycle"):
        wf.graph()
    registry = Registry()
    with pytest.raises(DefinitionError, match="cycle"):
        registry.add(wf)
    assert not registry.has("cyclic")
    assert registry.served() == set()


def test_unknown_dependency_raises() -> None:
    wf = chain(Workflow("unknown", input=In), {"a": [], "b": ["nope"]})
    with pytest.raises(DefinitionError, match="unknown stage 'nope'"):
        wf.graph()
    with pytest.raises(DefinitionError, match="nope"):
        Registry([wf])


def test_self_dependency_raises_when_the_stage_is_declared() -> None:
    wf = Workflow("selfdep", input=In)
    with pytest.raises(DefinitionError, match="itself"):
        chain(wf, {"a": ["a"]})
    assert wf.stages == {}


def test_duplicate_stage_id_raises() -> None:
    wf = chain(Workflow("dup", input=In), {"a": []})
    with pytest.raises(DefinitionError, match="already has a stage 'a'"):

        @wf.stage
        async def a(ctx: StageContext[In]) -> int:
            return 2

    with pytest.raises(DefinitionError, match="already has a stage 'a'"):
        chain(wf, {"a": []})


def test_duplicate_dependency_in_after_raises() -> None:
    wf = chain(Workflow("dupdep", input=In), {"a": []})
    with pytest.raises(DefinitionError, match="twice"):
        chain(wf, {"b": ["a", "a"]})


def test_dependency_on_a_stage_of_another_workflow_raises() -> None:
    other = Workflow("other", input=In)

    @other.stage
    async def foreign(ctx: StageContext[In]) -> int:
        return 1

    wf = Workflow("mine", input=In)
    with pytest.raises(DefinitionError, match="another workflow"):

        @wf.stage(after=[foreign])
        async def b(ctx: StageContext[In]) -> int:
            return 1


def test_empty_workflow_raises_at_graph_and_at_registry_add() -> None:
    wf = Workflow("empty", input=In)
    with pytest.raises(DefinitionError, match="no stages"):
        wf.graph()
    with pytest.raises(DefinitionError, match="no stages"):
        Registry().add(wf)
    with pytest.raises(DefinitionError, match="no stages"):
        Registry([wf])


# "order\n": the pattern's "$" also matched before a trailing newline, so a workflow or stage
# id ending in one was accepted (and reached SQL, task queue names and visibility queries)
@pytest.mark.parametrize("bad", ["", "has space", "a/b", "a:b", "-lead", "ünï", "a.b", "order\n"])
def test_invalid_workflow_ids_raise(bad: str) -> None:
    with pytest.raises(DefinitionError, match="invalid"):
        Workflow(bad, input=In)


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "a:b", "-lead", "a.b", "pay\n"])
def test_invalid_stage_ids_raise(bad: str) -> None:
    wf = Workflow("ids", input=In)
    with pytest.raises(DefinitionError, match="invalid"):
        chain(wf, {bad: []})
    assert wf.stages == {}


def test_lambda_without_id_is_an_invalid_stage_id() -> None:
    wf = Workflow("lam", input=In)
    with pytest.raises(DefinitionError, match="invalid"):
        wf.stage(lambda ctx: 1)


def test_workflow_input_must_be_a_pydantic_model() -> None:
    with pytest.raises(DefinitionError, match="BaseModel"):
        Workflow("bad-input", input=dict)  # type: ignore[type-var]


def test_workflow_explicit_version_must_not_be_empty() -> None:
    with pytest.raises(DefinitionError, match="version"):
        Workflow("v", input=In, version="")


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(seconds=-1)])
def test_stage_and_workflow_timeouts_must_be_positive(bad: timedelta) -> None:
    wf = Workflow("t", input=In)
    with pytest.raises(DefinitionError, match="timeout"):

        @wf.stage(timeout=bad)
        async def a(ctx: StageContext[In]) -> int:
            return 1

    with pytest.raises(DefinitionError, match="timeout"):
        Workflow("t2", input=In, timeout=bad)


def test_second_compensation_for_a_stage_raises() -> None:
    wf = Workflow("comp", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @a.compensation
    async def undo(ctx: StageContext[In], out: int) -> None:
        return None

    with pytest.raises(DefinitionError, match="already has a compensation"):
        a.compensation(undo)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": -3},
        {"max_attempts": 2.5},
        {"backoff": 0.5},
        {"backoff": float("nan")},
        {"initial_interval": timedelta(seconds=-1)},
        {"initial_interval": 1.0},
        {"max_interval": timedelta(seconds=-1)},
        {"max_interval": 10},
        {"non_retryable": (ValueError, "KeyError")},
        {"non_retryable": (int,)},
    ],
)
def test_bad_retry_values_raise(kwargs: dict[str, Any]) -> None:
    with pytest.raises(DefinitionError, match="Retry"):
        Retry(**kwargs)


def test_retry_must_be_a_retry_object() -> None:
    wf = Workflow("r", input=In)
    with pytest.raises(DefinitionError, match="Retry"):

        @wf.stage(retry={"max_attempts": 3})  # type: ignore[call-overload,untyped-decorator]
        async def a(ctx: StageContext[In]) -> int:
            return 1


def test_retry_non_retryable_given_as_a_list_or_a_single_class_still_works() -> None:
    r = Retry(non_retryable=[KeyError])  # type: ignore[arg-type]
    assert r.non_retryable == (KeyError,)
    assert not r.is_retryable(KeyError("x"))
    assert r.is_retryable(ValueError("x"))
    single = Retry(non_retryable=KeyError)  # type: ignore[arg-type]
    assert not single.is_retryable(KeyError("x"))
    assert hash(r) == hash(Retry(non_retryable=(KeyError,)))


# -- Retry delays ----------------------------------------------------------------------------


def test_retry_delay_grows_by_the_backoff() -> None:
    r = Retry(max_attempts=5, initial_interval=timedelta(seconds=1), backoff=2.0)
    assert [r.delay_after(a) for a in (1, 2, 3, 4)] == [
        timedelta(seconds=1),
        timedelta(seconds=2),
        timedelta(seconds=4),
        timedelta(seconds=8),
    ]


def test_retry_delay_is_capped_by_max_interval() -> None:
    r = Retry(initial_interval=timedelta(seconds=1), backoff=3.0, max_interval=timedelta(seconds=5))
    assert [r.delay_after(a) for a in (1, 2, 3, 4)] == [
        timedelta(seconds=1),
        timedelta(seconds=3),
        timedelta(seconds=5),
        timedelta(seconds=5),
    ]


def test_retry_delay_with_backoff_one_is_constant() -> None:
    r = Retry(initial_interval=timedelta(milliseconds=250), backoff=1.0)
    assert {r.delay_after(a) for a in range(1, 20)} == {timedelta(milliseconds=250)}


def test_retry_delay_of_a_huge_attempt_number_does_not_overflow() -> None:
    capped = Retry(backoff=10.0, max_interval=timedelta(minutes=1))
    assert capped.delay_after(5000) == timedelta(minutes=1)
    uncapped = Retry(backoff=10.0)
    assert uncapped.delay_after(5000) >= timedelta(days=365)


def test_default_retry_is_three_attempts_one_second_doubling() -> None:
    r = Retry()
    assert (r.max_attempts, r.initial_interval, r.backoff, r.max_interval) == (
        3,
        timedelta(seconds=1),
        2.0,
        None,
    )
    assert r.is_retryable(RuntimeError())
    assert not r.is_retryable(NonRetryableError("stop"))


# -- versions --------------------------------------------------------------------------------


def two_stage(
    wf_id: str = "v",
    *,
    input: type[BaseModel] = In,
    body_value: int = 1,
    b_after: tuple[str, ...] = ("a",),
    retry: Retry | None = None,
    timeout: timedelta | None = None,
    out: type[BaseModel] = Out,
    version: str | None = None,
) -> Workflow[Any]:
    wf: Workflow[Any] = Workflow(wf_id, input=input, version=version)

    async def a(ctx: StageContext[Any]) -> Out:
        return Out(value=body_value)

    async def b(ctx: StageContext[Any]) -> Any:
        return out.model_validate({"value": body_value * 2 if out is Out else "x"})

    b.__annotations__["return"] = out
    wf.stage(a, retry=retry, timeout=timeout)
    wf.stage(b, after=list(b_after))
    return wf


def test_version_is_a_hash_that_excludes_the_bodies() -> None:
    one = two_stage(body_value=1)
    two = two_stage(body_value=2)
    assert one.get_stage("a").fn is not two.get_stage("a").fn
    assert one.version == two.version
    assert one.graph().canonical_json() == two.graph().canonical_json()
    assert len(one.version) == 16


def test_version_changes_with_dependencies() -> None:
    assert two_stage().version == two_stage().version
    assert two_stage(b_after=()).version != two_stage().version


@pytest.mark.parametrize(
    "changed",
    [
        {"retry": Retry(max_attempts=5)},
        {"retry": Retry(initial_interval=timedelta(seconds=3))},
        {"retry": Retry(backoff=3.0)},
        {"retry": Retry(max_interval=timedelta(seconds=30))},
        {"retry": Retry(non_retryable=(KeyError,))},
        {"timeout": timedelta(seconds=30)},
        {"input": OtherIn},
        {"out": OtherOut},
        {"wf_id": "v2"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_version_changes_with_structure(changed: dict[str, Any]) -> None:
    assert two_stage(**changed).version != two_stage().version


@pytest.fixture
def helper(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The module tests/unit/_wf_helper.py (also imported by the hash-seed subprocesses)."""
    monkeypatch.syspath_prepend(str(HERE))
    return importlib.import_module("_wf_helper")


def test_output_type_is_read_even_when_parameter_annotations_are_hidden(helper: Any) -> None:
    # _wf_helper imports StageContext under TYPE_CHECKING only (a common pattern): the output
    # type must still be read from the return annotation.
    helper_wf = helper.helper_wf
    assert helper_wf.get_stage("first").output_type is helper.HelperOut
    assert helper_wf.graph().stage("first").output_schema["title"] == "HelperOut"
    assert helper_wf.graph().stage("fourth").output_schema == {"type": "null"}


def test_version_changes_when_a_compensation_is_declared_after_graph_was_read() -> None:
    wf = two_stage()
    before = wf.version
    assert wf.graph().stage("a").compensable is False

    @wf.get_stage("a").compensation
    async def undo(ctx: StageContext[Any], out: Out) -> None:
        return None

    assert wf.graph().stage("a").compensable is True
    assert wf.version != before


def test_version_changes_with_hooks_and_run_timeout() -> None:
    base = two_stage().version
    wf = two_stage()
    wf.hook_point("order.charged")
    assert wf.version != base
    assert wf.graph().hooks == ["order.charged"]
    timed: Workflow[Any] = Workflow("v", input=In, timeout=timedelta(hours=1))
    chain(timed, {"a": [], "b": ["a"]})
    assert timed.version != chain(Workflow("v", input=In), {"a": [], "b": ["a"]}).version


def test_explicit_version_is_used_as_is() -> None:
    wf = two_stage(version="2024-06-01")
    assert wf.version == "2024-06-01"
    assert wf.graph().version == "2024-06-01"


def test_version_does_not_depend_on_stage_declaration_order() -> None:
    one = chain(Workflow("o", input=In), {"a": [], "b": ["a"], "c": ["a"]})
    two = chain(Workflow("o", input=In), {"a": [], "c": ["a"], "b": ["a"]})
    assert one.version == two.version


def _version_in_subprocess(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(HERE)}
    code = "import _wf_helper; print(_wf_helper.helper_wf.version)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_version_is_stable_across_processes_and_hash_seeds(helper: Any) -> None:
    here = helper.helper_wf.version
    seeds = {_version_in_subprocess(seed) for seed in ("0", "1", "12345")}
    assert seeds == {here}


# -- canonical JSON --------------------------------------------------------------------------


def test_canonical_json_round_trips_through_the_graph_model(helper: Any) -> None:
    helper_wf = helper.helper_wf
    g = helper_wf.graph()
    text = g.canonical_json()
    back = GraphModel.model_validate_json(text)
    assert back == g
    assert back.canonical_json() == text
    assert back.version == helper_wf.version
    assert back.hooks == ["h1", "h2"]
    spec = back.stage("first")
    assert spec.retry.max_attempts == 4
    assert spec.retry.non_retryable == sorted(spec.retry.non_retryable)
    assert spec.timeout_s == 60.0
    assert back.groups == [["first"], ["second", "third"], ["fourth"]]


def test_graph_model_stage_lookup_of_an_unknown_stage_raises() -> None:
    g = two_stage().graph()
    with pytest.raises(DefinitionError):
        g.stage("zzz")
    with pytest.raises(DefinitionError):
        g.group_of("zzz")
    with pytest.raises(DefinitionError):
        two_stage().get_stage("zzz")


def test_downstream_is_the_stage_and_everything_that_depends_on_it() -> None:
    from pydantic import BaseModel

    from engine_port import Workflow

    class In(BaseModel):
        n: int = 0

    wf = Workflow("downstream", input=In)

    @wf.stage
    async def a(ctx: object) -> None: ...

    @wf.stage(after=[a])
    async def b(ctx: object) -> None: ...

    @wf.stage(after=[a])
    async def c(ctx: object) -> None: ...

    @wf.stage(after=[b])
    async def d(ctx: object) -> None: ...

    graph = wf.graph()
    assert graph.downstream("b") == {"b", "d"}
    assert graph.downstream("a") == {"a", "b", "c", "d"}
    assert graph.downstream("c") == {"c"}


def test_retry_delay_is_one_rule_for_both_drivers() -> None:
    r = Retry(
        max_attempts=5,
        initial_interval=timedelta(seconds=1),
        backoff=3.0,
        max_interval=timedelta(seconds=5),
    ).model()
    assert [r.delay_s(a) for a in (1, 2, 3)] == [1.0, 3.0, 5.0]


def test_redrive_set_per_origin() -> None:
    wf = Workflow("rd", input=_RdIn)

    @wf.stage
    async def a(ctx: Any) -> int:
        return 1

    @wf.stage(after=[a])
    async def b(ctx: Any) -> int:
        return 1

    @wf.stage(after=[a])
    async def c(ctx: Any) -> int:
        return 1

    @wf.stage(after=[b, c])
    async def d(ctx: Any) -> int:
        return 1

    g = wf.graph()
    statuses = {"a": "compensated", "b": "completed", "c": "failed", "d": "skipped"}
    assert g.redrive_set("last_failure", statuses, "r") == {"c", "d"}
    assert g.redrive_set("start", statuses, "r") == {"a", "b", "c", "d"}
    assert g.redrive_set("b", statuses, "r") == {"b", "d"}
    with pytest.raises(InvalidRedriveError, match="use 'last_failure', 'start' or one of"):
        g.redrive_set("nope", statuses, "r")
    with pytest.raises(InvalidRedriveError, match="no failed stage"):
        g.redrive_set("last_failure", dict.fromkeys("abcd", "completed"), "r")


class _RdIn(BaseModel):
    pass


def test_declared_signals_are_part_of_the_graph_and_undeclared_ones_leave_it_as_it_was() -> None:
    def build(signals: list[str] | None) -> Workflow[In]:
        wf = Workflow("sig-graph", input=In)

        if signals is None:

            @wf.stage
            async def a(ctx: StageContext[In]) -> int:
                return 1
        else:

            @wf.stage(signals=signals)
            async def a(ctx: StageContext[In]) -> int:
                return 1

        return wf

    plain, declared = build(None), build(["go", "approval", "go"])
    assert "signals" not in plain.graph().canonical_json()  # the structural hash is unchanged
    assert declared.graph().stage("a").signals == ["approval", "go"]
    assert declared.version != plain.version
    again = GraphModel.model_validate_json(declared.graph().canonical_json())
    assert again == declared.graph()
    assert "after_signal" not in declared.graph().canonical_json()
    with pytest.raises(DefinitionError, match="signal name"):
        build([""])
    gated = Workflow("sig-graph", input=In)

    @gated.stage(after_signal="go")
    async def a(ctx: StageContext[In]) -> int:
        return 1

    assert gated.version not in (plain.version, build(["go"]).version)
    again = GraphModel.model_validate_json(gated.graph().canonical_json())
    assert again == gated.graph() and again.stage("a").after_signal == "go"
    assert "after_signal_timeout_s" not in gated.graph().canonical_json()


def test_check_signal_known() -> None:
    from engine_port._signal_names import check_signal_known
    from engine_port.errors import UnknownSignalError

    wf = Workflow("sig-known", input=In)

    @wf.stage(signals="approval")
    async def a(ctx: StageContext[In]) -> int:
        return 1

    check_signal_known(wf.graph(), "r1", "approval")
    check_signal_known(None, "r1", "anything")  # the version is not known here
    with pytest.raises(UnknownSignalError, match=r"it declares 'approval'"):
        check_signal_known(wf.graph(), "r1", "aproval")


# -- handlers that could never be called -------------------------------------------------------


def test_a_stage_or_compensation_that_cannot_take_its_arguments_is_refused_at_definition() -> None:
    """These failed every attempt at run time, a compensation's only once a later stage
    had failed (the saga could then not undo the stage); a generator stage failed with a
    SerializationError of its output; a stage that is not a function said its id was ''."""
    wf = Workflow("handlers", input=In)

    async def none() -> int:
        return 1

    async def two(ctx: StageContext[In], extra: int) -> int:
        return 1

    async def gen(ctx: StageContext[In]) -> Any:
        yield 1

    for body, says in (
        (none, "stage 'none' must take one argument (ctx); it is none()"),
        (two, "must take one argument (ctx); it is two(ctx: 'StageContext[In]', extra: 'int')"),
        (gen, "stage 'gen' is a generator"),
        (5, "stage of workflow 'handlers' must be a function, not int"),
    ):
        with pytest.raises(DefinitionError) as err:
            wf.stage(body)
        assert says in str(err.value)
    assert wf.stages == {}

    @wf.stage
    async def a(ctx: StageContext[In], *more: Any, **kw: Any) -> int:
        return 1

    with pytest.raises(DefinitionError, match=r"must take two arguments \(ctx, output\)"):

        @a.compensation
        async def undo(ctx: StageContext[In]) -> None: ...

    @a.compensation
    def release(ctx: StageContext[In], output: int, reason: str = "") -> None: ...

    assert a.compensation_fn is release


def test_a_timeout_past_a_century_is_refused_at_definition() -> None:
    """``timedelta.max`` as a stage's or a run's timeout ran natively, and on Temporal failed
    every workflow task of the run with an OverflowError (the run never went on)."""
    wf = Workflow("timeouts", input=In)
    with pytest.raises(DefinitionError, match="at most 100 years"):
        wf.stage(lambda ctx: 1, id="a", timeout=timedelta.max)
    with pytest.raises(DefinitionError, match="at most 100 years"):
        Workflow("whole", input=In, timeout=timedelta(days=36526))
    wf.stage(lambda ctx: 1, id="b", timeout=timedelta(days=36525))  # a century is taken
