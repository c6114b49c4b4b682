"""``wfe ui``: a small web view of runs over the engine port (runs, one run's graph, timeline
and events, versions, outbox), read-only unless started with ``--allow-actions``.

Needs the ``ui`` extra (``pip install 'wfe[ui]'``)."""

from ._app import create_app
from ._inputs import BadRequestError

__all__ = ["BadRequestError", "create_app"]
