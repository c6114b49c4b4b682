"""The port's argument checks for calls a user can get wrong (engine_port/_limits.py) and the
messages they give; the conformance suite shows every driver calls them."""

from __future__ import annotations

import math

import pytest

from engine_port import RunStatus
from engine_port.driver import check_list_call, check_wait_call, check_workflow_ids
from engine_port.errors import InvalidInputError, RunNotActiveError


def test_one_workflow_id_given_as_a_string_is_not_read_as_its_characters() -> None:
    with pytest.raises(InvalidInputError, match=r"a list of workflow ids \(e\.g\. \['order'\]\)"):
        check_workflow_ids("order")
    with pytest.raises(InvalidInputError, match="not int"):
        check_workflow_ids(5)  # type: ignore[arg-type]
    assert check_workflow_ids(("order", "refund")) == ["order", "refund"]


def test_list_call_statuses_and_limits() -> None:
    assert check_list_call(None, None, 100, None) == []
    assert check_list_call("wf", "failed", 0, "ab") == [RunStatus.FAILED]
    assert check_list_call(None, {RunStatus.COMPLETED}, 1, None) == [RunStatus.COMPLETED]
    with pytest.raises(InvalidInputError, match="use one of pending, running"):
        check_list_call(None, ["completed", "complete"], 10, None)
    with pytest.raises(InvalidInputError, match="limit is negative"):
        check_list_call(None, None, -1, None)
    with pytest.raises(InvalidInputError, match="whole number of runs, not float"):
        check_list_call(None, None, 2.0, None)


def test_wait_timeouts() -> None:
    assert check_wait_call("r1", None) is None
    assert check_wait_call("r1", 0) == 0.0
    assert check_wait_call("r1", math.inf) is None
    for bad in ("1", -0.5, math.nan, False):
        with pytest.raises(InvalidInputError, match="timeout must be"):
            check_wait_call("r1", bad)


def test_a_refused_redrive_says_to_wait_for_the_run_to_end() -> None:
    message = str(RunNotActiveError("r1", "running", "redrive"))
    assert "only a completed, failed or cancelled run can be redriven" in message
    assert "use redrive()" not in message  # (what the signal/cancel refusal suggests)
    assert "use redrive() to re-run a terminal run" in str(
        RunNotActiveError("r1", "completed", "signal")
    )


def test_a_refused_call_to_a_moved_or_rolling_back_run_says_what_to_do_instead() -> None:
    """A signal to a run moved to another driver advised "use redrive() to re-run a terminal
    run" (a migrated run cannot be redriven where it was); one to a compensating run too."""
    moved = str(RunNotActiveError("r1", RunStatus.MIGRATED, "signal"))
    assert "it is migrated" in moved and "migrated_to" in moved
    assert "signal it through that driver's engine" in moved and "redrive" not in moved
    rolling = str(RunNotActiveError("r1", RunStatus.COMPENSATING, "cancel"))
    assert "rolling back" in rolling and "engine.wait" in rolling
