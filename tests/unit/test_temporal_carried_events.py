"""Events a Temporal stage activity carries in its input: the workflow leaves out what every
event of the run repeats, the activity puts it back, so the sink (or the parked batch) gets each
event exactly as emitted."""

from __future__ import annotations

from datetime import UTC, datetime

import pydantic_core

from driver_temporal._carry import compact, whole
from engine_port import Event


def _emitted() -> list[dict[str, object]]:
    at = datetime(2026, 12, 2, 23, 0, tzinfo=UTC)
    events = [
        Event(id="e1", run_id="r1", seq=1, type="run.created", workflow_id="w", at=at),
        Event(
            id="e2",
            run_id="r1",
            seq=2,
            type="stage.started",
            workflow_id="w",
            stage="a",
            data={"attempt": 1},
            at=at,
        ),
        Event(
            id="e3",
            run_id="r1",
            seq=3,
            type="order.paid",
            workflow_id="w",
            stage="a",
            business=True,
            data={"amount": 0, "note": None},
            at=at,
        ),
    ]
    return [e.model_dump(mode="json") for e in events]


def test_a_carried_batch_comes_back_whole() -> None:
    emitted = _emitted()
    carried = [compact(e) for e in emitted]
    assert whole(carried, "r1", "w") == emitted
    # a business event keeps its flag; data is never touched (0 and None inside it stay)
    assert carried[2]["business"] is True and carried[2]["data"] == {"amount": 0, "note": None}


def test_the_carried_form_leaves_out_what_every_event_repeats() -> None:
    emitted = _emitted()
    carried = [compact(e) for e in emitted]
    assert all("run_id" not in e and "workflow_id" not in e for e in carried)
    assert "stage" not in carried[0] and "business" not in carried[1]
    assert len(pydantic_core.to_json(carried)) < 0.7 * len(pydantic_core.to_json(emitted))


def test_a_batch_an_older_driver_carried_whole_stays_as_it_was() -> None:
    emitted = _emitted()
    assert whole(emitted, "r1", "w") == emitted
