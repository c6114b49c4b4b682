"""The names of the interpreter workflow's queries and updates, as an operator sees them.

The Web UI ("Send an Update", "Query") and ``temporal workflow metadata`` list every handler a
run declares (the ``__temporal_workflow_metadata`` query). The engine's own are named
``wfe.internal.*`` and described as internal: an operator acts on a run with its signal names
(declared per graph, see ``GraphWorkflow._declare_signals``), ``engine.cancel``/``redrive`` or
Temporal's own cancel/terminate/reset. Temporal offers no way to hide a handler from the UI.

Runs started before these names (their start document lacks ``names``) also keep the older
names registered, so the updates their histories hold replay, and older engines can still
reach them.
"""

from __future__ import annotations

__all__ = [
    "ABORT_EXPORT_UPDATE",
    "COMPLETE_EXPORT_UPDATE",
    "DELIVERY_DECIDED",
    "EVENTS_HANDED",
    "FREEZE_CANCELLED_QUERY",
    "FREEZE_UPDATE",
    "INTERNAL",
    "NAMES_MARK",
    "OLD_NAMES",
    "REPIN_UPDATE",
    "RUN_ENDED",
    "RUN_INFO_QUERY",
    "SIGNAL_STATUS_QUERY",
    "SIGNAL_STATUS_UPDATE",
    "SIGNAL_STORED",
    "SIGNAL_UPDATE",
    "TAKE_SIGNAL_UPDATE",
]

# what the UI shows next to every internal handler
INTERNAL = (
    "internal: do not send by hand (the wfe engine's own bookkeeping; signal the run by one "
    "of its signal names, or use the wfe engine's cancel/redrive)"
)
# the start document's ``names`` value of runs that declare only the names below
NAMES_MARK = "wfe.internal"

RUN_INFO_QUERY = "wfe.internal.run_info"
FREEZE_UPDATE = "wfe.internal.freeze"
COMPLETE_EXPORT_UPDATE = "wfe.internal.complete_export"
ABORT_EXPORT_UPDATE = "wfe.internal.abort_export"
FREEZE_CANCELLED_QUERY = "wfe.internal.freeze_cancelled"
TAKE_SIGNAL_UPDATE = "wfe.internal.take_signal"
SIGNAL_STATUS_UPDATE = "wfe.internal.signal_status"
SIGNAL_STATUS_QUERY = "wfe.internal.delivery"
# ``TemporalEngine.redrive(version=...)`` of a stranded active run (runs started with
# ``StartDocument.repins_in_place`` only, ``_repin``)
REPIN_UPDATE = "wfe.internal.repin"
SIGNAL_UPDATE = "wfe.signal"  # how older engines sent signals (runs before ``names`` only)
# not a handler: the extern function through which a worker's workflows tell the engine in the
# same process what became of a signal it sent (``_waiters``), never seen by an operator
DELIVERY_DECIDED = "wfe.delivery_decided"
# ... and the one through which a run's last workflow task has its worker record its end (its
# final state, its last events: ``_run_end``)
RUN_ENDED = "wfe.run_ended"
# ... and the one through which a running run's workflow task hands its worker the events no
# activity carries (``_outbox``, ``_run_end``)
EVENTS_HANDED = "wfe.events_handed"
# ... and the one through which a workflow task has its worker store an operator's signal too
# large to queue inline (``SignalHandlers.on_signal``)
SIGNAL_STORED = "wfe.signal_stored"

# current name -> the name runs started before ``names`` also answer to
OLD_NAMES = {
    RUN_INFO_QUERY: "wfe.run_info",
    FREEZE_UPDATE: "wfe.freeze",
    COMPLETE_EXPORT_UPDATE: "wfe.complete_export",
    ABORT_EXPORT_UPDATE: "wfe.abort_export",
    FREEZE_CANCELLED_QUERY: "wfe.freeze_cancelled",
    TAKE_SIGNAL_UPDATE: "wfe.take_signal",
}
