"""What a worker logs about stage attempts and compensations (logger ``wfe.stage``), and the
logger a stage body gets as ``ctx.log`` (``wfe.stage.user``). Both drivers log through here
(the StageRunner calls it), so their records read alike. Every record carries the ids as
``extra`` fields: ``wfe_run_id``, ``wfe_workflow``, ``wfe_stage``, ``wfe_attempt``."""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = ["StageLog", "StageLoggerAdapter", "stage_fields"]

STAGE_LOGGER = "wfe.stage"
USER_LOGGER = "wfe.stage.user"


# (fetched once: logging.getLogger takes the logging module's lock on every call, and a
# stage attempt made two of them)
_STAGE_LOG = logging.getLogger(STAGE_LOGGER)
_USER_LOG = logging.getLogger(USER_LOGGER)


def stage_fields(run_id: str, workflow: str, stage: str, attempt: int) -> dict[str, Any]:
    return {
        "wfe_run_id": run_id,
        "wfe_workflow": workflow,
        "wfe_stage": stage,
        "wfe_attempt": attempt,
    }


def _prefix(fields: Mapping[str, Any]) -> str:
    """The ids as message text."""
    return (
        f"run {fields['wfe_run_id']} {fields['wfe_workflow']}/{fields['wfe_stage']} "
        f"attempt {fields['wfe_attempt']}"
    )


class StageLoggerAdapter(logging.LoggerAdapter[logging.Logger]):
    """``ctx.log``: a logger bound to one stage attempt. Messages are prefixed with the run
    id, workflow, stage and attempt, which are also ``extra`` fields of every record (a
    caller's own ``extra=`` is merged in)."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        bound = dict(self.extra or {})
        kwargs["extra"] = {**bound, **(kwargs.get("extra") or {})}
        return msg, kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        prefix = _prefix(self.extra or {})
        # with args the message is a %-format: the prefix must not add conversions to it
        text = f"{prefix.replace('%', '%%')}: {msg}" if args else f"{prefix}: {msg}"
        super().log(level, text, *args, **kwargs)


class StageLog:
    """The lifecycle records of one stage attempt (or compensation)."""

    def __init__(self, run_id: str, workflow: str, stage: str, attempt: int) -> None:
        self.fields = stage_fields(run_id, workflow, stage, attempt)
        self.logger = _STAGE_LOG

    def user_logger(self) -> StageLoggerAdapter:
        return StageLoggerAdapter(_USER_LOG, dict(self.fields))

    def __call__(self, level: int, what: str, *args: Any, **extra: Any) -> None:
        if not self.logger.isEnabledFor(level):
            return
        self.logger.log(
            level, "%s: " + what, _prefix(self.fields), *args, extra={**self.fields, **extra}
        )
