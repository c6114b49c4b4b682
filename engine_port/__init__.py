"""engine_port: one workflow graph format, one engine API, several drivers.

Write a workflow once as a graph of durable stages; run it on the native driver (SQLite or
PostgreSQL) or on Temporal, chosen in configuration.

The public names, by audience (``__all__`` is their union; tests/unit/test_surface.py freezes
each list):

- workflow authors: :mod:`engine_port.authoring` (``Workflow``, ``Retry``, ``StageContext``,
  ``Registry``, ...);
- callers, the applications that start, signal, inspect and migrate runs:
  :mod:`engine_port.calling` (``create_engine``, ``EngineSettings``, ``RunInfo``, ...) and the
  typed errors in :mod:`engine_port.errors`;
- driver authors: the stage runner, its outcomes, the lifecycle, ledgers and claim-check
  helpers listed last below, with the declared driver interface in :mod:`engine_port.driver`.
"""

from . import authoring, calling
from ._blobs import ClaimCheck, box_inline, is_spill_ref, run_prefix
from ._events import event_id
from ._ledger import InMemoryLedger, StepLedger, StepRecord
from ._lifecycle import EventDraft, Lifecycle, run_output
from ._runner import Abandoned, Completed, Failed, Outcome, StageRequest, StageRunner, Suspended
from .authoring import *  # noqa: F403  (the names in authoring.__all__)
from .calling import *  # noqa: F403  (the names in calling.__all__)

__all__: list[str] = []
__all__ += authoring.__all__
__all__ += calling.__all__
# driver authors (engine_port.driver declares the rest of what a driver may use)
__all__ += [
    "Abandoned",
    "ClaimCheck",
    "Completed",
    "EventDraft",
    "Failed",
    "InMemoryLedger",
    "Lifecycle",
    "Outcome",
    "StageRequest",
    "StageRunner",
    "StepLedger",
    "StepRecord",
    "Suspended",
    "box_inline",
    "event_id",
    "is_spill_ref",
    "run_output",
    "run_prefix",
]
