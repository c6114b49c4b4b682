"""``TemporalEngine.steps``: a run's journaled steps, the list the native driver gives.

The native driver keeps one row per (run, ledger, step name) and lists them by ledger and name;
a stage's ledger is its id, its compensation's ``<stage id>#compensation``. Here the steps are:

- a stage's: those its latest execution started with (the start document's ``stages``: a
  redrive's kept stages and, from the last failure, its re-run ones; an import's), then those
  journaled since under the redrive that execution journals under (``r<redrive>/stage/``: its
  start document's, the run's current redrive but after a re-pin in place, which counts a
  redrive and leaves the journals where they are, ``_repin``), the later record of a step
  winning. A redrive from a stage or the start starts the stages it re-runs with no
  steps, as the native redrive deletes their rows;
- a compensation's: those journaled under the run's current redrive (``r<redrive>/compensate/``):
  a compensation after a redrive is a new one that runs its steps again, as the native redrive
  deletes the compensation rows.

Internal records (a local try's result document, kind ``outcome``) are not steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engine_port.driver import StepEntry

from ._journal import JournalKey, step_records
from ._wire import journal_stage_part

__all__ = ["COMPENSATION_LEDGER", "run_steps"]

# the suffix of a compensation's ledger id (the native driver's ``<stage id>#compensation``)
COMPENSATION_LEDGER = "#compensation"


def run_steps(
    stage_ids: Iterable[str],
    redrive: int,
    started: Mapping[str, Any],
    journals: Mapping[JournalKey, list[dict[str, Any]]],
) -> list[StepEntry]:
    """The run's steps by ledger and name: ``stage_ids`` its stages, ``redrive`` the redrive
    its latest execution journals under, ``started`` the start document's ``stages`` of that
    execution, ``journals`` what ``read_run_journals`` read."""
    out: list[StepEntry] = []
    for sid in stage_ids:
        # its folder in either key shape (``StartDocument.blob_keys``): a run's execution
        # writes one shape only, and no other stage's folder is named like either
        parts = dict.fromkeys((journal_stage_part(sid), journal_stage_part(sid, True)))
        state = started.get(sid)
        carried = (state.get("steps") if isinstance(state, dict) else None) or {}
        journaled = [r for p in parts for r in journals.get((p, redrive, "stage"), [])]
        steps = _latest([*carried.values(), *journaled])
        undone = _latest([r for p in parts for r in journals.get((p, redrive, "compensate"), [])])
        out.extend(_entry(sid, r) for r in steps)
        out.extend(_entry(sid + COMPENSATION_LEDGER, r) for r in undone)
    return sorted(out, key=lambda e: (e.stage, e.name))


def _latest(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps among ``records`` (oldest first), the later record of a name winning."""
    return list({r["name"]: r for r in step_records(records)}.values())


def _entry(ledger: str, record: dict[str, Any]) -> StepEntry:
    return StepEntry(
        stage=ledger,
        name=record["name"],
        kind=record["kind"],
        completed=bool(record.get("completed")),
        signal=record.get("signal"),
    )
