"""The reference model of the contract, pinned to the hand-written golden traces so it cannot
drift from what the scenarios (and so the drivers) were checked against."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conformance._cases import (
    Case,
    Emit,
    RunStep,
    Sleep,
    StageCase,
    Wait,
    bounded,
    cases,
    fixed_draws,
    make_valid,
)
from conformance._model import FULL, LateSignalRefused, ModelError, canonical, expect
from conformance._trace import GOLDEN_DIR


def golden(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN_DIR / f"{name}.json").read_text())
    return data


def renamed(value: Any) -> Any:
    """The goldens' user exception names for the model's scripted ones."""
    text = json.dumps(value).replace("ScriptedError", "RuntimeError")
    return json.loads(text.replace("UndoError", "RuntimeError"))


def run_part(case: Case) -> dict[str, Any]:
    exp = expect(case)
    obs = exp.observation()["run"]
    return dict(renamed(obs))


def bodies(case: Case) -> dict[str, int]:
    return {k.split(":", 1)[1]: v for k, v in expect(case).counts.items() if k.startswith("body:")}


def chain(*ids: str, **over: StageCase) -> tuple[StageCase, ...]:
    out = []
    for i, sid in enumerate(ids):
        out.append(over.get(sid, StageCase(sid, after=(ids[i - 1],) if i else ())))
    return tuple(out)


def saga(fail_at: str, failing_comp: str | None = None, redrive: bool = False) -> Case:
    stages = []
    prev: tuple[str, ...] = ()
    for sid in "abcd":
        stages.append(
            StageCase(
                sid,
                after=prev,
                max_attempts=2,
                ops=(Emit("a.done", 1),) if sid == "a" else (),
                outcomes=("fatal",) if sid == fail_at else ("ok",),
                compensation=(("fail" if sid == failing_comp else "ok") if sid in "ab" else None),
            )
        )
        prev = (sid,)
    return Case(tuple(stages), redrive=redrive)


def test_s1_linear() -> None:
    case = Case(chain("a", "b", "c"))
    g = golden("s1_linear")
    assert expect(case).trace == g["trace"]
    assert run_part(case) == g["run"]
    assert bodies(case) == g["counts"]
    assert expect(case).output == {"id": "c", "attempt": 1, "deps": ["b"], "got": []}


def test_s2_parallel() -> None:
    stages = (
        StageCase("a"),
        StageCase("b", after=("a",)),
        StageCase("c", after=("a",)),
        StageCase("d", after=("b", "c")),
    )
    g = golden("s2_parallel")
    for order in (("a", "b", "c", "d"), ("a", "c", "b", "d")):
        case = Case(stages, order=order)
        assert expect(case).trace == g["trace"]
        assert run_part(case) == g["run"]


def test_s3_retries_and_exhausted() -> None:
    b = StageCase("b", after=("a",), max_attempts=3, outcomes=("error", "error", "ok"))
    case = Case(chain("a", "b", "c", b=b))
    g = golden("s3_retries")
    assert renamed(expect(case).trace) == g["trace"]
    assert run_part(case) == g["run"]
    assert bodies(case)["b"] == g["counts"]["b"]
    a = StageCase("a", max_attempts=2, outcomes=("error", "error"))
    exhausted = Case(chain("a", "b", a=a))
    g = golden("s3_exhausted")
    got = renamed(expect(exhausted).trace)
    assert json.dumps(got).replace("RuntimeError", "ValueError") == json.dumps(g["trace"])


@pytest.mark.parametrize("fail_at", ["a", "b", "c", "d"])
def test_s4_compensation(fail_at: str) -> None:
    case = saga(fail_at)
    g = golden("s4_compensation" if fail_at == "c" else f"s4_fail_at_{fail_at}")
    assert expect(case).trace == g["trace"]
    assert run_part(case) == g["run"]
    if fail_at == "c":
        assert expect(case).compensations == ["comp:b", "comp:a"]


def test_s5_failing_compensation() -> None:
    case = saga("c", failing_comp="a")
    g = golden("s5_failing_compensation")
    assert expect(case).trace == g["trace"]
    assert run_part(case) == g["run"]
    assert expect(case).compensations == ["comp:b", "comp:a", "comp:a"]  # a retried, gave up


def test_s6_sleep() -> None:
    case = Case((StageCase("s", ops=(RunStep("x"), Sleep("nap", 300))),))
    g = golden("s6_sleep")
    exp = expect(case)
    assert exp.trace == g["trace"]
    assert exp.counts == {"body:s": 2, "step:s.x": 1}


def test_s7_s8_signals() -> None:
    after = Case((StageCase("w", ops=(RunStep("x"), Wait("go"))),))
    assert expect(after).trace == golden("s7_signal_after_wait")["trace"]
    assert expect(after).counts == {"body:w": 2, "step:w.x": 1}
    before = Case((StageCase("w", ops=(RunStep("x"), Wait("go", "before"))),))
    assert expect(before).trace == golden("s8_signal_before_wait")["trace"]


def test_s9_wait_timeout() -> None:
    w = StageCase("w", max_attempts=2, ops=(RunStep("x"), Wait("go", "timeout", 300)))
    exp = expect(Case((w,)))
    assert exp.trace == golden("s9_wait_timeout")["trace"]
    assert exp.counts["step:w.x"] == 1
    caught = StageCase("w", ops=(Wait("go", "timeout", 100, catch=True),))
    assert expect(Case((caught,))).output == {"id": "w", "attempt": 1, "deps": [], "got": [None]}


def test_s10_cancel_suspended() -> None:
    stages = (
        StageCase("a", compensation="ok"),
        StageCase("b", after=("a",), compensation="ok"),
        StageCase("c", after=("b",), hold=True),
    )
    case = Case(stages, cancel="c")
    g = golden("s10_cancel_suspended")
    trace = json.loads(json.dumps(expect(case).trace).replace("hold_c", "go"))
    assert trace == g["trace"]
    assert run_part(case) == g["run"]


def test_s12_redrive_last_failure() -> None:
    case = saga("c", redrive=True)
    g = golden("s12_redrive_last_failure")
    exp = expect(case)
    assert exp.redrive and exp.failed_stage == "c"  # only c's next attempt is scripted to pass
    assert exp.trace == g["trace"]
    assert run_part(case) == g["run"]
    assert exp.counts == {
        "body:a": 1,
        "body:b": 1,
        "body:c": 2,
        "body:d": 1,
        "comp:a": 1,
        "comp:b": 1,
    }


def test_parallel_failure_stops_the_group() -> None:
    """b holds, c fails for good, d is blocked behind c: b and d cancelled, a compensated."""
    stages = (
        StageCase("a", compensation="ok", ops=(Emit("a.e", 1),)),
        StageCase("b", after=("a",), hold=True),
        StageCase("c", after=("a",), outcomes=("fatal",)),
        StageCase("d", after=("a",)),
        StageCase("e", after=("b", "c", "d")),
    )
    exp = expect(Case(stages, order=("a", "b", "c", "d", "e")))
    assert exp.status == "failed" and exp.held_when_failed
    assert exp.stages == {
        "a": "compensated",
        "b": "cancelled",
        "c": "failed",
        "d": "cancelled",
        "e": "skipped",
    }
    assert exp.trace[4:] == [
        ["stage.started", "b", 1],
        ["stage.suspended", "b", "signal", "signal:hold_b"],
        ["stage.started", "c", 1],
        ["stage.failed", "c", 1, "NonRetryableError", False],
        ["stage.started", "d", 1],
        ["stage.cancelled", "b"],
        ["stage.cancelled", "d"],
        ["stage.compensated", "a"],
        ["run.failed", "NonRetryableError", None],
    ]
    assert "body:d" not in exp.counts  # d never got past its barrier


def test_business_events_in_completion_order() -> None:
    stages = (
        StageCase("a", ops=(Emit("a.1", 1), Emit("a.2", 2))),
        StageCase("b", after=("a",), ops=(Emit("b.1", 3),)),
        StageCase("c", after=("a",), ops=(Emit("c.1", 4),)),
    )
    exp = expect(Case(stages, order=("a", "c", "b")))
    assert exp.trace[-5:] == [
        ["business", "a.1", "a", {"n": 1}],
        ["business", "a.2", "a", {"n": 2}],
        ["business", "c.1", "c", {"n": 4}],
        ["business", "b.1", "b", {"n": 3}],
        ["run.completed"],
    ]
    assert exp.output == {
        "b": {"id": "b", "attempt": 1, "deps": ["a"], "got": []},
        "c": {"id": "c", "attempt": 1, "deps": ["a"], "got": []},
    }


def test_a_hold_nobody_ends_is_rejected_and_dropped() -> None:
    case = Case((StageCase("a", hold=True),))
    with pytest.raises(ModelError):
        expect(case)
    assert not make_valid(case).stages[0].hold


def test_canonical_sorts_cancelled_runs() -> None:
    trace = [["x"], ["stage.cancelled", "d"], ["stage.cancelled", "b"], ["y"]]
    assert canonical(trace) == [["x"], ["stage.cancelled", "b"], ["stage.cancelled", "d"], ["y"]]


def test_to_python_round_trips() -> None:
    from hypothesis import HealthCheck, given, settings

    @settings(
        max_examples=30,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(cases())
    def check(case: Case) -> None:
        rebuilt = eval(case.to_python())  # our own printed code
        assert rebuilt == case
        expect(case)  # every generated case is one the model pins down

    with fixed_draws():  # (the same cases whatever ran before in this process)
        check()


# -- gates (``@wf.stage(after_signal=...)``, ``StageCase.gate``) --------------------------------


def test_gate_waits_before_the_body_without_invoking_it() -> None:
    """As a body that begins with the wait, one body invocation fewer (the SignalGateContract
    shape): nothing before the signal ran, the body's first wait returns the payload."""
    gated = Case((StageCase("w", ops=(RunStep("x"),), gate="after"),))
    exp = expect(gated)
    assert exp.trace == [
        ["run.created"],
        ["run.started"],
        ["stage.started", "w", 1],
        ["stage.suspended", "w", "signal", "signal:gate_w"],
        ["stage.completed", "w", 1],
        ["run.completed"],
    ]
    assert exp.counts == {"body:w": 1, "step:w.x": 1}
    assert exp.output == {"id": "w", "attempt": 1, "deps": [], "got": [{"sig": "gate_w"}, "w.x"]}
    assert exp.signals == {"gate_w": [[True, False]]}
    waited = Case((StageCase("w", ops=(Wait("gate_w"), RunStep("x"))),))
    assert expect(waited).trace == exp.trace
    assert expect(waited).output == exp.output
    assert expect(waited).counts == {"body:w": 2, "step:w.x": 1}


def test_a_buffered_gate_does_not_suspend() -> None:
    case = Case((StageCase("a"), StageCase("b", after=("a",), gate="before")))
    exp = expect(case)
    assert [e for e in exp.trace if e[0] == "stage.suspended"] == []
    assert exp.counts == {"body:a": 1, "body:b": 1}
    assert exp.output["got"] == [{"sig": "gate_b"}]
    assert exp.signals == {"gate_b": [[False, False], [False, True]]}  # repeat: not queued


def test_a_gate_that_times_out_fails_every_attempt_without_the_body() -> None:
    """As a body that begins with an uncaught timed wait, minus the body: one suspension,
    then each attempt fails with StepTimeoutError (the retries at once); earlier stages are
    compensated, nothing after runs."""
    w = StageCase("w", after=("a",), max_attempts=2, ops=(RunStep("x"),), gate="timeout")
    case = Case((StageCase("a", compensation="ok"), w, StageCase("z", after=("w",))))
    exp = expect(case)
    assert exp.trace[4:] == [
        ["stage.started", "w", 1],
        ["stage.suspended", "w", "signal", "signal:gate_w"],
        ["stage.failed", "w", 1, "StepTimeoutError", True],
        ["stage.started", "w", 2],
        ["stage.failed", "w", 2, "StepTimeoutError", False],
        ["stage.compensated", "a"],
        ["run.failed", "StepTimeoutError", None],
    ]
    assert exp.counts == {"body:a": 1, "comp:a": 1}
    assert exp.error == ["StepTimeoutError", "w"] and exp.signals == {}
    # a redrive is for scripted failures: a timed-out gate is not redriven
    assert expect(replace(case, redrive=True)).trace == exp.trace


def test_a_retry_passes_the_journaled_gate() -> None:
    w = StageCase("w", max_attempts=3, outcomes=("error", "error", "ok"), gate="after")
    exp = expect(Case((w,)))
    assert exp.trace[2:-1] == [
        ["stage.started", "w", 1],
        ["stage.suspended", "w", "signal", "signal:gate_w"],
        ["stage.failed", "w", 1, "ScriptedError", True],
        ["stage.started", "w", 2],
        ["stage.failed", "w", 2, "ScriptedError", True],
        ["stage.started", "w", 3],
        ["stage.completed", "w", 3],
    ]
    assert exp.counts == {"body:w": 3}
    assert exp.output["got"] == [{"sig": "gate_w"}]
    assert exp.signals == {"gate_w": [[True, False]]}  # sent once


def test_a_redriven_stage_passes_its_journaled_gate() -> None:
    stages = (
        StageCase("a", compensation="ok"),
        StageCase("b", after=("a",), outcomes=("fatal",), gate="after"),
        StageCase("c", after=("b",), gate="after"),
    )
    exp = expect(Case(stages, redrive=True))
    assert exp.status == "completed" and exp.redrive and exp.failed_stage == "b"
    assert exp.trace == [
        ["run.created"],
        ["run.started"],
        ["stage.started", "a", 1],
        ["stage.completed", "a", 1],
        ["stage.started", "b", 1],
        ["stage.suspended", "b", "signal", "signal:gate_b"],
        ["stage.failed", "b", 1, "NonRetryableError", False],
        ["stage.compensated", "a"],
        ["run.failed", "NonRetryableError", None],
        ["run.redriven", "last_failure"],
        ["stage.started", "b", 1],  # its gate journaled: no second wait, no second signal
        ["stage.completed", "b", 1],
        ["stage.started", "c", 1],
        ["stage.suspended", "c", "signal", "signal:gate_c"],
        ["stage.completed", "c", 1],
        ["run.completed"],
    ]
    assert exp.counts == {"body:a": 1, "body:b": 2, "body:c": 1, "comp:a": 1}
    assert exp.signals == {"gate_b": [[True, False]], "gate_c": [[True, False]]}


def test_a_gate_blocked_behind_a_failed_sibling_ends_cancelled() -> None:
    """c fails for good first in the order: b, suspended on its gate at once (a gate waits
    before the body's barrier), never gets its signal and is cancelled; a buffered gate (d)
    was passed, its body blocked at the barrier, uninvoked."""
    stages = (
        StageCase("a", compensation="ok"),
        StageCase("b", after=("a",), gate="after"),
        StageCase("c", after=("a",), outcomes=("fatal",)),
        StageCase("d", after=("a",), gate="before"),
    )
    exp = expect(Case(stages, order=("a", "c", "b", "d")))
    assert exp.status == "failed" and exp.stopped == ["b", "d"]
    assert exp.trace[4:] == [
        ["stage.started", "b", 1],
        ["stage.suspended", "b", "signal", "signal:gate_b"],
        ["stage.started", "c", 1],
        ["stage.failed", "c", 1, "NonRetryableError", False],
        ["stage.started", "d", 1],
        ["stage.cancelled", "b"],
        ["stage.cancelled", "d"],
        ["stage.compensated", "a"],
        ["run.failed", "NonRetryableError", None],
    ]
    assert exp.counts == {"body:a": 1, "body:c": 1, "comp:a": 1}
    assert exp.signals == {"gate_d": [[False, False], [False, True]]}  # gate_b never sent


def test_a_cancel_finds_a_gate_waiting() -> None:
    stages = (
        StageCase("a", compensation="ok"),
        StageCase("b", after=("a",), gate="after"),
        StageCase("c", after=("a",), hold=True, gate="after"),
    )
    exp = expect(Case(stages, order=("a", "c", "b"), cancel="c"))
    assert exp.status == "cancelled"
    assert exp.stages == {"a": "compensated", "b": "cancelled", "c": "cancelled"}
    assert exp.trace[4:] == [
        ["stage.started", "b", 1],
        ["stage.suspended", "b", "signal", "signal:gate_b"],
        ["stage.started", "c", 1],
        ["stage.suspended", "c", "signal", "signal:gate_c"],
        ["stage.suspended", "c", "signal", "signal:hold_c"],
        ["stage.cancelled", "b"],
        ["stage.cancelled", "c"],
        ["stage.compensated", "a"],
        ["run.cancelled"],
    ]
    assert exp.counts == {"body:a": 1, "body:c": 1, "comp:a": 1}
    assert exp.signals == {"gate_c": [[True, False]]}


def test_the_generator_draws_gates_where_they_are_deterministic() -> None:
    from hypothesis import HealthCheck, given, settings

    from conformance._cases import groups_of

    drawn: dict[str, int] = {"after": 0, "before": 0, "timeout": 0}

    @settings(
        max_examples=200,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(cases())
    def check(case: Case) -> None:
        first = groups_of(case)[0]
        for s in case.stages:
            if s.gate is None:
                continue
            drawn[s.gate] += 1
            assert not s.local
            assert s.gate != "before" or s.id not in first
            if s.gate == "timeout":  # its deadline is not ordered with siblings
                assert [s.id] in groups_of(case) and not s.hold
            assert s.gate_key == f"gate_{s.id}"
            assert s.gate_signal == f"gate_{s.gate_shares or s.id}"
        assert eval(case.to_python()) == case

    with fixed_draws():  # (the same cases whatever ran before in this process)
        check()
    assert drawn["after"] > 0 and drawn["before"] > 0 and drawn["timeout"] > 0


# -- repeated waits for one signal name (an approval loop, ``Wait``) ----------------------------


def test_a_stage_waiting_again_for_a_name_gets_one_signal_per_wait() -> None:
    """The k-th wait for a name is the step ``name#k``: it suspends on the name again, gets
    its own signal (the runner sends one per ``after`` wait, its payload naming the step), and
    a retry passes every journaled wait at once."""
    from conformance._cases import wait_keys

    ops = (
        Wait("go"),
        RunStep("x"),
        Wait("go", "timeout", 400, catch=True),
        Wait("go"),
        Wait("no", "timeout", 400, catch=True),
    )
    assert wait_keys(ops) == ["go", None, "go#2", "go#3", "no"]
    s = StageCase("w", max_attempts=2, ops=ops, outcomes=("error", "ok"))
    exp = expect(Case((s,)))
    suspended = [e for e in exp.trace if e[0] == "stage.suspended"]
    assert suspended == [["stage.suspended", "w", "signal", "signal:go"]] * 3 + [
        ["stage.suspended", "w", "signal", "signal:no"]
    ]
    assert exp.output["got"] == [{"sig": "go"}, "w.x", None, {"sig": "go#3"}, None]
    assert exp.counts == {"body:w": 6, "step:w.x": 1}
    # one answer per ``after`` wait, none for the timeout ones
    assert exp.signals == {"go": [[True, False], [True, False]]}


def test_the_generator_repeats_a_wait_only_where_it_is_deterministic() -> None:
    from hypothesis import HealthCheck, given, settings

    from conformance._cases import wait_keys

    drawn = {"local": 0, "regular": 0, "early": 0, "mixed": 0}
    # (every count must come out above 0: a corner drawn a few times in 300 cases was drawn
    # none when the module's other tests ran first, the draws differing with them; they no
    # longer do (``fixed_draws``), and 1,500 cases draw the rarest, ``mixed``, 20 times)

    @settings(
        max_examples=1500,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(cases())
    def check(case: Case) -> None:
        for s in case.stages:
            waits = [op for op in s.ops if isinstance(op, Wait)]
            repeated = {k.split("#")[0] for k in wait_keys(s.ops) if k is not None and "#" in k}
            for name in repeated:  # its early waits (before, during) come first
                modes = [op.mode for op in waits if op.name == name]
                late = [m in ("after", "timeout") for m in modes]
                assert late == sorted(late), (s.id, modes)
                assert not s.local or all(late)
                early = modes.count("before") + modes.count("during")
                if early >= 2:
                    drawn["early"] += 1
                if early and not all(late) and any(late):
                    drawn["mixed"] += 1
            if any(op.name in repeated and op.mode == "after" for op in waits):
                drawn["local" if s.local else "regular"] += 1

    with fixed_draws():  # (the same cases whatever ran before in this process)
        check()
    assert all(drawn.values()), drawn


def test_early_signals_of_a_repeated_name_go_to_the_waits_in_order() -> None:
    """``before`` and ``during`` waits for one name take its signals (sent at start, in the
    order of the waits) oldest first: the k-th wait the k-th, without suspending; a late wait
    for the name after them suspends (its first suspension on the name) and gets its own."""
    from conformance._cases import wait_keys
    from conformance._fuzz import after_waits, early_waits

    ops = (
        Wait("go", "before"),
        RunStep("x"),
        Wait("go", "during"),
        Wait("go", "before"),
        Wait("go", "timeout", 400, catch=True),
        Wait("go"),
    )
    assert wait_keys(ops) == ["go", None, "go#2", "go#3", "go#4", "go#5"]
    a = StageCase("a")
    b = StageCase("b", after=("a",), max_attempts=2, ops=ops, outcomes=("error", "ok"))
    case = Case((a, b))
    assert early_waits(case) == [
        ("go", "before", "go"),
        ("go", "during", "go#2"),
        ("go", "before", "go#3"),
    ]
    # the ``after`` wait is the second late one: its signal goes at the 2nd suspension on go
    assert after_waits(case) == [("b", "go", 2, "go#5")]
    exp = expect(case)
    assert exp.output["got"] == [
        {"sig": "go"},
        "b.x",
        {"sig": "go#2"},
        {"sig": "go#3"},
        None,
        {"sig": "go#5"},
    ]
    suspended = [e for e in exp.trace if e[0] == "stage.suspended"]
    assert suspended == [["stage.suspended", "b", "signal", "signal:go"]] * 2
    # each ``before`` signal buffered and its repeat not queued again, then the ``after`` one
    # delivered (the ``during`` one races with the body: not compared)
    assert exp.signals == {"go": [[False, False], [False, True]] * 2 + [[True, False]]}


def test_gates_sharing_a_name_take_its_signals_in_group_order() -> None:
    """A gate of a later group may wait for the signal name of an earlier group's gate: each
    takes the signal meant for it (its payload names the stage), ``before`` ones at start,
    ``after`` ones once their stage suspended on it."""
    from conformance._cases import groups_of
    from conformance._fuzz import early_waits
    from conformance._model import _Sim

    a = StageCase("a")
    b = StageCase("b", after=("a",), gate="before")
    c = StageCase("c", after=("b",), gate="before", gate_shares="b")
    d = StageCase("d", after=("c",), gate="after", gate_shares="b")
    e = StageCase("e", after=("d",), gate="after", gate_shares="b")
    case = Case((a, b, c, d, e))
    assert {s.gate_signal for s in case.stages[1:]} == {"gate_b"}
    assert early_waits(case) == [("gate_b", "before", "gate_b"), ("gate_b", "before", "gate_c")]
    exp = expect(case)
    assert exp.status == "completed"
    assert exp.output["got"] == [{"sig": "gate_e"}]
    sim = _Sim(case)  # (only the sink's output is the run's: each stage's from the model)
    sim.run_groups(groups_of(case), [])
    assert {sid: sim.outputs[sid]["got"] for sid in "bcde"} == {
        sid: [{"sig": f"gate_{sid}"}] for sid in "bcde"
    }
    assert [x for x in exp.trace if x[0] == "stage.suspended"] == [
        ["stage.suspended", "d", "signal", "signal:gate_b"],
        ["stage.suspended", "e", "signal", "signal:gate_b"],
    ]
    assert exp.gates_sent == ["gate_d", "gate_e"]
    assert exp.signals == {"gate_b": [[False, False], [False, True]] * 2 + [[True, False]] * 2}


def test_the_generator_shares_gate_names_only_across_groups() -> None:
    from hypothesis import HealthCheck, given, settings

    from conformance._cases import groups_of

    drawn = {"before": 0, "after": 0}

    @settings(
        max_examples=1000,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(cases())
    def check(case: Case) -> None:
        layer = {sid: k for k, g in enumerate(groups_of(case)) for sid in g}
        by_name: dict[str, list[StageCase]] = {}
        for s in case.stages:
            if s.gate is not None:
                by_name.setdefault(s.gate_signal, []).append(s)
        for gates in by_name.values():
            if len(gates) < 2:
                continue
            assert all(g.gate in ("before", "after") for g in gates)
            gates.sort(key=lambda g: layer[g.id])
            levels = [layer[g.id] for g in gates]
            assert len(set(levels)) == len(levels)  # never two in one group
            late = [g.gate == "after" for g in gates]
            assert late == sorted(late)  # its before gates first
            for g in gates[1:]:
                drawn[str(g.gate)] += 1
        assert eval(case.to_python()) == case

    with fixed_draws():  # (the same cases whatever ran before in this process)
        check()
    assert all(drawn.values()), drawn


def test_a_bounded_case_refuses_early_signals_past_its_bound() -> None:
    """Bound 1: the first early signal is queued, the ones after it refused (a keyed one's
    retry too, its key never seen); their gate and wait then suspend and take the signal the
    runner sends again, delivered; a retry of the queued one's key is already_completed."""
    case = bounded(
        Case(
            stages=(
                StageCase("a", ops=(Wait("x", "during"),)),
                StageCase("b", after=("a",), ops=(Wait("y", "before"),), gate="before"),
            )
        ),
        1,
    )
    exp = expect(case)
    assert exp.signals == {
        "aw0": [[False, False]],
        "bw0": [FULL, FULL, [True, False]],
        "gate_b": [FULL, FULL, [True, False]],
    }
    assert ["stage.suspended", "b", "signal", "signal:gate_b"] in exp.trace
    assert ["stage.suspended", "b", "signal", "signal:bw0"] in exp.trace
    assert exp.status == "completed"
    two = expect(replace(case, bound=2))
    assert two.signals["gate_b"] == [[False, False], [False, True]]
    assert two.signals["bw0"] == [FULL, FULL, [True, False]]


def test_a_cancelled_run_whose_compensation_fails_stays_cancelled() -> None:
    case = Case(
        stages=(
            StageCase("a", compensation="fail", max_attempts=2),
            StageCase("b", after=("a",), hold=True),
        ),
        cancel="b",
    )
    exp = expect(case)
    assert (exp.status, exp.error, exp.compensation_errors) == (
        "cancelled",
        None,
        [["UndoError", "a"]],
    )
    assert exp.stages == {"a": "completed", "b": "cancelled"}
    assert exp.trace[-2:] == [["stage.cancelled", "b"], ["run.cancelled"]]
    assert exp.counts["comp:a"] == 2


def test_a_redrive_reruns_the_siblings_the_failure_cancelled_and_may_fail_again() -> None:
    # b holds (settled), c fails for good: b is cancelled; the redrive re-runs c and b (its
    # hold now sent), then d. With ``refail`` the first redrive fails again at c.
    stages = (
        StageCase("a", compensation="ok"),
        StageCase("b", after=("a",), ops=(RunStep("b0"),), hold=True),
        StageCase("c", after=("a",), outcomes=("fatal",)),
        StageCase("d", after=("b", "c")),
    )
    once = expect(Case(stages=stages, order=("a", "b", "c", "d"), redrive=True))
    assert once.status == "completed" and once.redrives == 1
    tail = once.trace[once.trace.index(["run.redriven", "last_failure"]) :]
    assert tail[:4] == [
        ["run.redriven", "last_failure"],
        ["stage.started", "b", 1],
        ["stage.suspended", "b", "signal", "signal:hold_b"],
        ["stage.completed", "b", 1],
    ]
    assert once.counts["step:b.b0"] == 1  # its journal kept
    twice = expect(Case(stages=stages, order=("a", "b", "c", "d"), redrive=True, refail=True))
    assert twice.status == "completed" and twice.redrives == 2
    assert [e for e in twice.trace if e[0] in ("run.failed", "run.redriven")] == [
        ["run.failed", "NonRetryableError", None],
        ["run.redriven", "last_failure"],
        ["run.failed", "NonRetryableError", None],
        ["run.redriven", "last_failure"],
    ]
    assert twice.counts["comp:a"] == 2


@pytest.mark.parametrize(
    ("outcome", "got", "suspensions"),
    [
        ("took", [{"sig": "a0"}, None], 2),
        ("queued", [None, {"sig": "a0"}], 1),
        ("late", [None, {"sig": "a0"}], 2),
        ("left", [None, None], 2),
    ],
)
def test_a_race_wait_signal_is_taken_once_or_left(
    outcome: str, got: list[Any], suspensions: int
) -> None:
    stage = StageCase(
        "a",
        ops=(
            Wait("a0", "race", ms=400, catch=True, lag=400),
            Wait("a0", "timeout", ms=400, catch=True),
        ),
    )
    exp = expect(Case(stages=(stage,)), races={"a0": outcome})
    assert exp.output["got"] == got
    assert sum(e[0] == "stage.suspended" for e in exp.trace) == suspensions


def test_the_generator_draws_the_corners() -> None:
    from hypothesis import HealthCheck, given, settings

    drawn = {
        "race": 0,
        "refail": 0,
        "redrive_after_cancelled": 0,
        "cancel_undo_fails": 0,
        "cancel_after_redrive": 0,
        # the cancel stage holds for the first time in the redriven run
        "cancel_after_redrive_first_hold": 0,
        "cancel_after_second_redrive": 0,
        # the cancel stage is the one that failed for good and was redriven: it holds then
        "cancel_while_the_redriven_stage_holds": 0,
        "cancel_while_the_redriven_stage_holds_after_a_second_redrive": 0,
    }

    @settings(
        max_examples=1000,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(cases())
    def check(case: Case) -> None:
        exp = expect(case)
        drawn["race"] += any(
            isinstance(op, Wait) and op.mode == "race" for s in case.stages for op in s.ops
        )
        drawn["refail"] += exp.redrives == 2
        if exp.redrive:
            first = exp.trace[: exp.trace.index(["run.redriven", "last_failure"])]
            drawn["redrive_after_cancelled"] += any(e[0] == "stage.cancelled" for e in first)
        drawn["cancel_undo_fails"] += exp.status == "cancelled" and bool(exp.compensation_errors)
        drawn["cancel_after_redrive"] += exp.status == "cancelled" and exp.redrive
        if exp.status == "cancelled" and exp.redrive:
            assert case.cancel is not None
            hold = ["stage.suspended", case.cancel, "signal", f"signal:hold_{case.cancel}"]
            drawn["cancel_after_redrive_first_hold"] += exp.trace.count(hold) == 1
            drawn["cancel_after_second_redrive"] += exp.redrives == 2
            itself = exp.failed_stage == case.cancel
            drawn["cancel_while_the_redriven_stage_holds"] += itself
            key = "cancel_while_the_redriven_stage_holds_after_a_second_redrive"
            drawn[key] += itself and exp.redrives == 2

    with fixed_draws():  # (the same cases whatever ran before in this process)
        check()
    assert all(drawn.values()), drawn


# a module of this project imported between two draws (its constants are what hypothesis may
# draw instead of random values: integers, floats and short text the generator accepts)
_NEW_MODULE = """
NUMBERS = (7, 11, 123456789, -98765, 2**70, 0.25, -3.5e200)
TEXTS = ("zq", "\u00e9t\u00e9", "k9", "\u4e2d")
"""

_DRAW_TWICE = """
import sys
from hypothesis import HealthCheck, given, settings
from conformance._cases import cases, fixed_draws

def draw():
    out = []

    @settings(max_examples=60, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases())
    def check(case):
        out.append(case.to_python())

    with fixed_draws():
        check()
    return out

first = draw()
sys.path.insert(0, sys.argv[1])
import wfe_pool_probe  # noqa
second = draw()
print(len(first), len(second), sum(a != b for a, b in zip(first, second)))
"""


def test_the_generator_checks_draw_the_same_cases_whatever_ran_before(tmp_path: Path) -> None:
    """The checks above count what the generator drew in derandomized draws; hypothesis's
    seed alone did not fix the cases: it draws constants of the project's modules imported
    so far now and then, so a corner drawn in one pytest process was not in another, where
    other tests had imported other modules first (``fixed_draws``). A process that imports a
    module between two draws draws the same cases twice."""
    (tmp_path / "wfe_pool_probe.py").write_text(_NEW_MODULE, encoding="utf-8")
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", _DRAW_TWICE, str(tmp_path)],
        check=False,
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["60", "60", "0"], out.stdout


def test_a_first_stage_timing_out_on_its_gate_loses_it_beside_early_signals() -> None:
    """A timeout gate in the first group fails the run ~400 ms after the start, maybe before
    the runner sent the early signals (RunNotActiveError): ``make_valid`` drops it then."""
    early = Case(
        stages=(
            StageCase("a", gate="timeout"),
            StageCase("b", after=("a",), ops=(Wait("b0", "before"),)),
        )
    )
    for case in (early, bounded(early, 1)):
        valid = make_valid(case)
        assert valid.stages[0] == case.stages[0]  # its gate kept: b never runs
        assert valid.stages[1].ops == (Wait(valid.stages[1].ops[0].name, "after"),)
        assert expect(valid).signals == {}
    alone = Case(stages=(StageCase("a", gate="timeout"), StageCase("b", after=("a",))))
    assert make_valid(alone) == alone  # (no early signal to race: it stays)
    later = Case(
        stages=(
            StageCase("a", ops=(Wait("a0", "during"),)),
            StageCase("b", after=("a",), gate="timeout"),
        )
    )
    assert make_valid(later) == later  # (its group starts once the first one completed)


def test_a_hold_signal_after_a_redrive_meets_the_bound() -> None:
    """The early signal queued for c stays queued across b's failure and the redrive: the
    hold's signal the runner sends once a holds again is refused at bound 1 (as the native
    driver answers), so the case needs bound 2."""
    case = bounded(
        Case(
            stages=(
                StageCase("a", hold=True),
                StageCase("b", outcomes=("fatal",)),
                StageCase("c", after=("a", "b"), ops=(Wait("c0", "before"),)),
            ),
            order=("a", "b", "c"),
            redrive=True,
        ),
        1,
    )
    with pytest.raises(LateSignalRefused):
        expect(case)
    valid = make_valid(case)
    assert valid.bound == 2
    assert expect(valid).status == "completed" and expect(valid).redrives == 1


def test_a_cancel_after_a_redrive() -> None:
    """``cancel_late``: b holds (settled) in the first run and c fails; the redrive re-runs b
    (its journaled gate passed at once) and c; b holds again, the runner cancels: c, blocked
    behind it (its journaled gate passed at once: no suspension), is cancelled, a
    compensated again, the run ends cancelled."""
    case = Case(
        stages=(
            StageCase("a", compensation="ok"),
            StageCase("b", after=("a",), hold=True, gate="after"),
            StageCase("c", after=("a",), outcomes=("fatal",), gate="after"),
            StageCase("d", after=("b", "c")),
        ),
        order=("a", "b", "c", "d"),
        cancel="b",
        redrive=True,
        cancel_late=True,
    )
    exp = expect(case)
    assert (exp.status, exp.redrives, exp.cancel) == ("cancelled", 1, True)
    assert exp.stages == {"a": "compensated", "b": "cancelled", "c": "cancelled", "d": "skipped"}
    assert exp.trace[exp.trace.index(["run.redriven", "last_failure"]) :] == [
        ["run.redriven", "last_failure"],
        ["stage.started", "b", 1],
        ["stage.suspended", "b", "signal", "signal:hold_b"],
        ["stage.started", "c", 1],
        ["stage.cancelled", "b"],
        ["stage.cancelled", "c"],
        ["stage.compensated", "a"],
        ["run.cancelled"],
    ]
    assert exp.counts == {"body:a": 1, "body:b": 2, "body:c": 1, "comp:a": 2}
    assert exp.compensations == ["comp:a", "comp:a"]
    assert exp.signals == {"gate_b": [[True, False]], "gate_c": [[True, False]]}
    assert make_valid(case) == case
    # with nothing failing after it in the first run, it is cancelled there (a plain cancel)
    alone = replace(case, stages=tuple(replace(s, outcomes=("ok",)) for s in case.stages))
    assert make_valid(alone) == replace(alone, cancel_late=False)


def test_a_cancel_after_a_second_redrive_holding_only_in_the_redriven_run() -> None:
    """``cancel_late`` with the failing stage before the cancel stage: b fails for good before
    c ever runs, the first redrive fails at b again (``refail``), the second one completes b
    and c holds for the first time: the runner cancels. c is cancelled, d (blocked behind it
    in its group) too, a (kept since the first run) compensated a third time, b (completed
    in the last run, no compensation) left completed, e never run."""
    case = Case(
        stages=(
            StageCase("a", compensation="ok"),
            StageCase("b", after=("a",), outcomes=("fatal",)),
            StageCase("c", after=("b",), hold=True, compensation="ok"),
            StageCase("d", after=("b",), gate="after"),
            StageCase("e", after=("c", "d")),
        ),
        order=("a", "b", "c", "d", "e"),
        cancel="c",
        redrive=True,
        refail=True,
        cancel_late=True,
    )
    exp = expect(case)
    assert (exp.status, exp.redrives, exp.cancel) == ("cancelled", 2, True)
    assert exp.stages == {
        "a": "compensated",
        "b": "completed",
        "c": "cancelled",
        "d": "cancelled",
        "e": "skipped",
    }
    redriven = ["run.redriven", "last_failure"]
    last = len(exp.trace) - exp.trace[::-1].index(redriven) - 1
    assert exp.trace.count(redriven) == 2
    assert exp.trace[last:] == [
        redriven,
        ["stage.started", "b", 1],
        ["stage.completed", "b", 1],
        ["stage.started", "c", 1],
        ["stage.suspended", "c", "signal", "signal:hold_c"],
        ["stage.started", "d", 1],
        ["stage.suspended", "d", "signal", "signal:gate_d"],
        ["stage.cancelled", "c"],
        ["stage.cancelled", "d"],
        ["stage.compensated", "a"],
        ["run.cancelled"],
    ]
    assert exp.counts == {"body:a": 1, "body:b": 3, "body:c": 1, "comp:a": 3}
    assert exp.compensations == ["comp:a", "comp:a", "comp:a"]
    assert exp.signals == {}  # (d's gate: never sent, it is blocked behind c)
    assert make_valid(case) == case


def test_a_cancel_while_the_redriven_stage_itself_holds() -> None:
    """``cancel_late`` with the cancel stage the one that fails: b (gated, a journaled step)
    fails for good in the first run before its hold (an attempt scripted to fail fails
    first) and c, blocked behind it, is cancelled; the redrive re-runs b (its gate and step
    journaled: passed at once, not run again) and c; b now holds, the runner cancels: b and
    c cancelled, a compensated again, b's compensation never run (it never completed)."""
    case = Case(
        stages=(
            StageCase("a", compensation="ok"),
            StageCase(
                "b",
                after=("a",),
                ops=(RunStep("b0"),),
                outcomes=("fatal",),
                compensation="ok",
                hold=True,
                gate="after",
            ),
            StageCase("c", after=("a",)),
            StageCase("d", after=("b", "c")),
        ),
        order=("a", "b", "c", "d"),
        cancel="b",
        redrive=True,
        cancel_late=True,
    )
    exp = expect(case)
    assert (exp.status, exp.redrives, exp.cancel, exp.failed_stage) == ("cancelled", 1, True, "b")
    assert exp.stages == {"a": "compensated", "b": "cancelled", "c": "cancelled", "d": "skipped"}
    redriven = exp.trace.index(["run.redriven", "last_failure"])
    assert exp.trace[2:redriven] == [
        ["stage.started", "a", 1],
        ["stage.completed", "a", 1],
        ["stage.started", "b", 1],
        ["stage.suspended", "b", "signal", "signal:gate_b"],
        ["stage.failed", "b", 1, "NonRetryableError", False],
        ["stage.started", "c", 1],
        ["stage.cancelled", "c"],
        ["stage.compensated", "a"],
        ["run.failed", "NonRetryableError", None],
    ]
    assert exp.trace[redriven:] == [
        ["run.redriven", "last_failure"],
        ["stage.started", "b", 1],
        ["stage.suspended", "b", "signal", "signal:hold_b"],
        ["stage.started", "c", 1],
        ["stage.cancelled", "b"],
        ["stage.cancelled", "c"],
        ["stage.compensated", "a"],
        ["run.cancelled"],
    ]
    assert exp.counts == {"body:a": 1, "body:b": 2, "comp:a": 2, "step:b.b0": 1}
    assert exp.compensations == ["comp:a", "comp:a"]
    assert exp.signals == {"gate_b": [[True, False]]}
    assert make_valid(case) == case


def test_a_cancel_while_the_redriven_stage_holds_after_a_second_redrive() -> None:
    """The same alone in its run, its retries run out in the first run (ScriptedError), the
    first redrive fails it again at once (NonRetryableError, before its hold), the second
    one holds: the runner cancels. Nothing completed: nothing compensated."""
    case = Case(
        stages=(
            StageCase(
                "a",
                max_attempts=2,
                outcomes=("error", "error"),
                compensation="ok",
                hold=True,
            ),
        ),
        cancel="a",
        redrive=True,
        refail=True,
        cancel_late=True,
    )
    exp = expect(case)
    assert (exp.status, exp.redrives, exp.stages) == ("cancelled", 2, {"a": "cancelled"})
    assert exp.trace == [
        ["run.created"],
        ["run.started"],
        ["stage.started", "a", 1],
        ["stage.failed", "a", 1, "ScriptedError", True],
        ["stage.started", "a", 2],
        ["stage.failed", "a", 2, "ScriptedError", False],
        ["run.failed", "ScriptedError", None],
        ["run.redriven", "last_failure"],
        ["stage.started", "a", 1],
        ["stage.failed", "a", 1, "NonRetryableError", False],
        ["run.failed", "NonRetryableError", None],
        ["run.redriven", "last_failure"],
        ["stage.started", "a", 1],
        ["stage.suspended", "a", "signal", "signal:hold_a"],
        ["stage.cancelled", "a"],
        ["run.cancelled"],
    ]
    assert exp.counts == {"body:a": 4}
    assert exp.compensations == []
    assert make_valid(case) == case
    # (any other holding stage still holds before its outcome: a plain hold of a failing
    # stage waits for good in the first run, and the case is cancelled at once)
    plain = replace(case, cancel_late=False, redrive=False, refail=False)
    assert expect(plain).trace[-3:] == [
        ["stage.suspended", "a", "signal", "signal:hold_a"],
        ["stage.cancelled", "a"],
        ["run.cancelled"],
    ]
