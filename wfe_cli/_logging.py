"""Log output of ``wfe worker`` (library code never configures logging)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from engine_port.errors import ConfigurationError

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure_logging"]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, every ``wfe_*`` extra field of the record, and ``exception`` if any."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update((k, v) for k, v in record.__dict__.items() if k.startswith("wfe_"))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        return json.dumps(doc, default=str, ensure_ascii=False)


def configure_logging(level: str, fmt: str) -> None:
    """Send log records at ``level`` and above to stderr in format ``fmt`` (text or json,
    any case), through one handler on the root logger (replacing handlers set up before),
    Python warnings included (logger ``py.warnings``)."""
    name = level.strip().upper()
    numeric = logging.getLevelNamesMapping().get(name)
    if numeric is None:
        raise ConfigurationError(
            f"unknown log level {level!r}; use one of DEBUG, INFO, WARNING, ERROR, CRITICAL "
            "(--log-level or WFE_LOG_LEVEL)"
        )
    fmt_name = fmt.strip().lower()
    if fmt_name not in LOG_FORMATS:
        raise ConfigurationError(f"unknown log format {fmt!r}; use --log-format text or json")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt_name == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    # Python warnings (a stage's "coroutine ... was never awaited", a library's deprecation)
    # go through this handler too: printed on their own they broke one-JSON-object-per-line
    logging.captureWarnings(True)
