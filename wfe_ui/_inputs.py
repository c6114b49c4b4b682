"""Validation of every value a request brings: path parts, query filters and form fields.

Anything outside these rules is refused with :class:`BadRequestError` (HTTP 400) before the
engine is asked; the engine checks its own limits again."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from engine_port import RunStatus
from engine_port.errors import InvalidInputError

__all__ = [
    "LIMITS",
    "REFRESH_SECONDS",
    "BadRequestError",
    "RunFilter",
    "check_name",
    "check_run_id",
    "check_submission",
    "parse_payload",
    "parse_run_filter",
]

LIMITS = (20, 50, 100, 200)
REFRESH_SECONDS = (0, 2, 5, 10, 30)
_TEXT = re.compile(r"^[^\x00-\x1f\x7f]+$")
_DURATION = re.compile(r"^([0-9]{1,6})([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_SINCE_DAYS = 36500  # 100 years: an older cutoff is before the first date a datetime holds
_SUBMISSION = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


class BadRequestError(InvalidInputError):
    """A request value the web view refuses (answered with HTTP 400 and this message)."""

    def __init__(self, detail: str) -> None:
        super().__init__(None, detail)


def _text(value: str, field: str, limit: int) -> str:
    if len(value) > limit or not _TEXT.fullmatch(value):
        raise BadRequestError(
            f"{field} must be 1 to {limit} printable characters (no control characters)"
        )
    return value


def check_run_id(value: str) -> str:
    return _text(value, "the run id", 64)


def check_name(value: str, field: str, limit: int = 200) -> str:
    return _text(value, field, limit)


def _int_choice(raw: str | None, field: str, choices: tuple[int, ...], default: int) -> int:
    if raw is None or raw == "":
        return default
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses
    if not (raw.isascii() and raw.isdigit()) or int(raw) not in choices:
        raise BadRequestError(f"{field} must be one of {', '.join(map(str, choices))}")
    return int(raw)


def refresh_seconds(raw: str | None, default: int) -> int:
    return _int_choice(raw, "refresh", REFRESH_SECONDS, default)


@dataclass(frozen=True)
class RunFilter:
    """The runs list's filters, all optional."""

    workflow: str | None = None
    statuses: tuple[RunStatus, ...] = ()
    version: str | None = None
    since: str | None = None
    since_seconds: int | None = None
    q: str | None = None
    limit: int = 50
    refresh: int = 10
    after: str | None = None  # page cursor given by the previous page (drivers that page)
    # the moment ``since`` counts back from, fixed by the first page and carried by its
    # "Older runs" link: a driver's cursor is good only for the listing that gave it, and
    # a cutoff taken from the clock again on every page is another listing (Temporal)
    cutoff: datetime | None = None

    def query(self, **override: Any) -> dict[str, Any]:
        """The filter as query parameters (for links that keep it)."""
        values: dict[str, Any] = {
            "workflow": self.workflow,
            "status": [s.value for s in self.statuses],
            "version": self.version,
            "since": self.since,
            "q": self.q,
            "limit": self.limit,
            "refresh": self.refresh,
            "after": self.after,
            "cutoff": None if self.cutoff is None else self.cutoff.isoformat(),
        }
        values.update(override)
        return {k: v for k, v in values.items() if v not in (None, "", [])}

    @property
    def since_delta(self) -> timedelta | None:
        return None if self.since_seconds is None else timedelta(seconds=self.since_seconds)


def parse_run_filter(params: Any) -> RunFilter:
    """Read the runs list's query parameters (a Starlette ``QueryParams``)."""

    def one(name: str, limit: int) -> str | None:
        raw = params.get(name)
        if raw is None or raw.strip() == "":
            return None
        return _text(raw.strip(), name, limit)

    valid = [s.value for s in RunStatus]
    statuses = []
    for raw in params.getlist("status"):
        if raw == "":
            continue
        if raw not in valid:
            raise BadRequestError(f"status must be one of {', '.join(valid)}")
        statuses.append(RunStatus(raw))
    since = one("since", 10)
    since_seconds = None
    if since is not None:
        m = _DURATION.match(since)
        if m is None:
            raise BadRequestError("since must be a number and a unit: 30m, 12h, 7d")
        since_seconds = int(m.group(1)) * _UNIT[m.group(2)]
        if since_seconds > MAX_SINCE_DAYS * 86400:
            raise BadRequestError(
                f"since must be at most {MAX_SINCE_DAYS}d (100 years); leave it empty for all runs"
            )
    return RunFilter(
        workflow=one("workflow", 200),
        statuses=tuple(dict.fromkeys(statuses)),
        version=one("version", 100),
        since=since,
        since_seconds=since_seconds,
        q=one("q", 300),
        limit=_int_choice(params.get("limit"), "limit", LIMITS, 50),
        refresh=refresh_seconds(params.get("refresh"), 10),
        after=_cursor(params.get("after")),
        cutoff=_cutoff(params.get("cutoff")),
    )


_CURSOR = re.compile(r"^[^\x00-\x20\x7f]{1,4000}$")  # the driver checks it is one of its own


def _cursor(raw: str | None) -> str | None:
    if raw is None or raw == "":
        return None
    if not _CURSOR.fullmatch(raw):
        raise BadRequestError("after must be the page cursor an 'Older runs' link gave")
    return raw


def _cutoff(raw: str | None) -> datetime | None:
    if raw is None or raw == "":
        return None
    try:
        at = datetime.fromisoformat(raw) if len(raw) <= 40 else None
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise BadRequestError("cutoff must be the time an 'Older runs' link gave")
    return at


def check_submission(raw: str) -> str | None:
    """The token a rendered form carries (``submission``): one per page load, so that a
    double click on one form sends one signal. Anything else is ignored (no token)."""
    return raw if _SUBMISSION.fullmatch(raw) else None


def parse_payload(raw: str) -> Any:
    """A signal payload typed in a form: JSON, empty meaning null; refused (400) when it is
    not JSON or Python cannot read it (the engine refuses NaN and deep nesting itself)."""
    if raw.strip() == "":
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadRequestError(f'the payload is not JSON ({exc}); e.g. {{"ok": true}}') from None
    except RecursionError:  # nested far deeper than the engine's limit
        raise BadRequestError(
            "the payload is nested far deeper than the engine stores (objects or arrays "
            "inside each other, thousands of levels); flatten it"
        ) from None
    except ValueError as exc:  # an integer literal over Python's digit limit
        raise BadRequestError(
            f"the payload has a number JSON tools cannot read ({str(exc).split(';')[0]}); "
            "send it as a string"
        ) from None
