"""Each rule both drivers apply is written once, in engine_port (engine_port/_rules.py,
RetryModel.delay_s, the status sets, engine_port/_limits.py), and drivers call it. The scan
below fails when a driver writes one out again: an exponential delay (``**``), a
``f"{workflow}@{version}"`` key, a literal collection equal to one of the port's status sets,
its own redrive plan (``GraphModel.redrive_set`` without the target-version check of
``redrive_plan``), or an engine method that skips the port's argument checks.

KNOWN_COPIES lists the copies that predate these functions: the drivers were being refactored
when they were written (issues 12 and 13), so they switch to the shared function after that
merge, and each entry is deleted with its copy (a stale entry fails too).
"""

from __future__ import annotations

import ast
import math
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from engine_port import Retry, StageSpec
from engine_port._models import ACTIVE_RUN_STATUSES, TERMINAL_RUN_STATUSES, RunStatus
from engine_port.driver import (
    REDRIVABLE_RUN_STATUSES,
    WORKING_RUN_STATUSES,
    GraphModel,
    redrive_plan,
    repin_plan,
    sink_retry_delay,
    version_key,
)
from engine_port.errors import InvalidRedriveError

ROOT = Path(__file__).resolve().parents[2]
DRIVER_PACKAGES = ("driver_native", "driver_temporal", "driver_memory")

NAMED_SETS = {
    "TERMINAL_RUN_STATUSES": TERMINAL_RUN_STATUSES,
    "ACTIVE_RUN_STATUSES": ACTIVE_RUN_STATUSES,
    "WORKING_RUN_STATUSES": WORKING_RUN_STATUSES,
    "REDRIVABLE_RUN_STATUSES": REDRIVABLE_RUN_STATUSES,
}

# (file, rule, source of the copy) -> how many times; to switch to the shared function
KNOWN_COPIES: Counter[tuple[str, str, str]] = Counter()

# the port's argument checks each engine method must call (engine_port/_limits.py)
REQUIRED_CHECKS = {
    "start": {"start_definition", "check_start_input"},
    "get_run": {"check_run_call"},
    "list_runs": {"check_list_call"},
    "list_runs_page": {"check_list_call", "check_page_call"},
    "wait": {"check_wait_call"},
    "signal": {"check_signal_call"},
    "cancel": {"check_run_call"},
    "redrive": {"check_run_call", "check_version"},
    "export_run": {"check_run_call"},
    "complete_export": {"check_export_target", "check_run_call"},
    "drain": {"check_export_target", "check_workflow_ids"},
    "abort_export": {"check_run_call"},
    "import_run": {"check_import_call"},
    "purge": {"check_purge_call"},
    "steps": {"check_run_call"},
}


def _status_members(node: ast.AST) -> set[RunStatus] | None:
    if not isinstance(node, ast.Tuple | ast.Set | ast.List):
        return None
    members = set()
    for elt in node.elts:
        if not (
            isinstance(elt, ast.Attribute)
            and isinstance(elt.value, ast.Name)
            and elt.value.id == "RunStatus"
        ):
            return None
        members.add(RunStatus[elt.attr])
    return members


def copies_in(source: str) -> list[tuple[str, str]]:
    """(rule, source) for each place ``source`` writes out a shared rule again."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            rule = "sink_retry_delay" if "2" in ast.unparse(node.left) else "retry_delay"
            found.append((rule, ast.unparse(node)))
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            for before, mid, after in zip(parts, parts[1:], parts[2:], strict=False):
                if (
                    isinstance(mid, ast.Constant)
                    and mid.value == "@"
                    and isinstance(before, ast.FormattedValue)
                    and isinstance(after, ast.FormattedValue)
                ):
                    found.append(("version_key", ast.unparse(node)))
        elif (members := _status_members(node)) is not None:
            for name, named in NAMED_SETS.items():
                if members == named:
                    found.append((name, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "redrive_set"
        ):
            found.append(("redrive_plan", ast.unparse(node)))
    return found


def _driver_copies() -> Counter[tuple[str, str, str]]:
    out: Counter[tuple[str, str, str]] = Counter()
    for package in DRIVER_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for rule, source in copies_in(path.read_text(encoding="utf-8")):
                out[(str(path.relative_to(ROOT)), rule, source)] += 1
    return out


def test_no_driver_writes_a_shared_rule_out_again() -> None:
    copies = _driver_copies()
    new = copies - KNOWN_COPIES
    assert not new, f"call the engine_port.driver function instead: {sorted(new)}"


def test_known_copies_are_still_there() -> None:
    """Delete an entry of KNOWN_COPIES when its copy switches to the shared function."""
    gone = KNOWN_COPIES - _driver_copies()
    assert not gone, f"switched to the shared rule? remove from KNOWN_COPIES: {sorted(gone)}"


@pytest.mark.parametrize(
    "source",
    [
        "delay = initial * backoff ** (attempt - 1)",
        "key = f'{run.workflow_id}@{run.version}'",
        "done = {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.MIGRATED}",
        "plan = graph.redrive_set(from_, statuses, run_id)",
    ],
)
def test_the_scan_recognises_each_kind_of_copy(source: str) -> None:
    assert copies_in(source)


def test_the_scan_leaves_other_code_alone() -> None:
    assert (
        copies_in("x = f'{a}-{b}'; y = (RunStatus.RUNNING, RunStatus.SUSPENDED); z = a * b") == []
    )


@pytest.mark.parametrize("module", ["driver_native/_engine.py", "driver_temporal/_engine.py"])
def test_engine_methods_call_the_port_argument_checks(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
    [engine] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Engine")]
    missing = {}
    for method in engine.body:
        if isinstance(method, ast.AsyncFunctionDef) and method.name in REQUIRED_CHECKS:
            called = {
                n.func.id
                for n in ast.walk(method)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            }
            if REQUIRED_CHECKS[method.name] - called:
                missing[method.name] = sorted(REQUIRED_CHECKS[method.name] - called)
    assert missing == {}


# -- the shared functions ----------------------------------------------------------------------


def test_version_key() -> None:
    assert version_key("order", "v2") == "order@v2"


def test_status_sets() -> None:
    assert ACTIVE_RUN_STATUSES - {RunStatus.COMPENSATING} == WORKING_RUN_STATUSES
    assert TERMINAL_RUN_STATUSES - {RunStatus.MIGRATED} == REDRIVABLE_RUN_STATUSES


def test_sink_retry_delay_doubles_caps_and_never_overflows() -> None:
    assert [sink_retry_delay(n, 0.5, 30.0) for n in (0, 1, 2, 3, 7, 8)] == [
        0.5,
        0.5,
        1.0,
        2.0,
        30.0,
        30.0,
    ]
    assert sink_retry_delay(5000, 0.5, 30.0) == 30.0
    assert math.isfinite(sink_retry_delay(5000, 0.5, math.inf))


def test_retry_delay_never_overflows() -> None:
    retry = Retry(max_attempts=5000, initial_interval=timedelta(seconds=1), backoff=2.0)
    assert retry.delay_after(1025) > timedelta(days=300)


def _graph(*stages: str) -> GraphModel:
    return GraphModel(
        workflow_id="wf",
        version="v2",
        input_schema={},
        stages=[StageSpec(id=s, after=[], retry=Retry().model(), output_schema={}) for s in stages],
        groups=[list(stages)],
    )


def test_redrive_plan_checks_the_target_versions_stages() -> None:
    graph = _graph("a", "b")
    assert redrive_plan(graph, "last_failure", {"a": "completed", "b": "failed"}, "r1") == {"b"}
    with pytest.raises(InvalidRedriveError, match="cannot move to version 'v2'"):
        redrive_plan(graph, "start", {"a": "completed", "c": "failed"}, "r1")
    with pytest.raises(InvalidRedriveError, match="no failed stage"):
        redrive_plan(graph, "last_failure", {"a": "completed", "b": "completed"}, "r1")


def test_repin_plan_keeps_the_stages_and_refuses_from() -> None:
    """A redrive of a run that has not ended only re-pins it: to a version with the same
    stages and dependencies, without ``from_``; its own version is nothing to do."""
    mine = _graph("a", "b").model_copy(update={"version": "v1"})
    assert repin_plan(mine, _graph("a", "b"), "last_failure", "r1") is True
    assert repin_plan(mine, mine, "last_failure", "r1") is False
    with pytest.raises(InvalidRedriveError, match="stages differ"):
        repin_plan(mine, _graph("a", "c"), "last_failure", "r1")
    chained = _graph("a", "b")
    chained.stages[1] = chained.stages[1].model_copy(update={"after": ["a"]})
    with pytest.raises(InvalidRedriveError, match="stages differ"):
        repin_plan(mine, chained, "last_failure", "r1")
    for from_ in ("start", "a"):
        with pytest.raises(InvalidRedriveError, match="from_ applies to a terminal run"):
            repin_plan(mine, _graph("a", "b"), from_, "r1")


def test_a_refused_repin_says_to_wait_or_cancel() -> None:
    from engine_port.errors import RunNotActiveError

    busy = RunNotActiveError("r1", "running", "redrive", running="b")
    assert busy.running == "b"
    assert "stage 'b' is running an attempt now" in str(busy)
    assert "wait" in str(busy) and "cancel" in str(busy)
    parked = str(RunNotActiveError("r1", "suspended", "redrive"))
    assert "version=" in parked
