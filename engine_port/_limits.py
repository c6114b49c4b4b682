"""The limits of every backend, checked once, here, before user code runs or anything is written.

The native schema's columns are bounded (``driver_native/_schema.py``: run ids 64 characters,
workflow and stage ids 200, versions 100, idempotency keys 300, ...), PostgreSQL cannot store a
NUL character in text or JSON, and no backend takes NaN/Infinity, lone UTF-16 surrogates or
unbounded nesting in JSON. SQLite accepts all of these, so without a check in the port the same
value would work on one database and fail on another -- after user code ran. Temporal's own
limits (1,000-byte ids and names) are looser than these, so one set of limits serves every
driver.

Every check raises :class:`~engine_port.errors.InvalidInputError` naming the field and the
limit, and never echoes the offending value (it may be a secret).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ._models import RunSnapshot, RunStatus
from ._serde import JSON, to_json_value
from .errors import DefinitionError, EngineError, InvalidInputError, SerializationError

if TYPE_CHECKING:
    from ._graph import Workflow

__all__ = [
    "MAX_EVENT_TYPE_LENGTH",
    "MAX_HOOK_NAME_LENGTH",
    "MAX_IDEMPOTENCY_KEY_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT_DIGITS",
    "MAX_RUN_ID_LENGTH",
    "MAX_SIGNAL_KEY_LENGTH",
    "MAX_SIGNAL_NAME_LENGTH",
    "MAX_STAGE_ID_LENGTH",
    "MAX_STEP_NAME_LENGTH",
    "MAX_TARGET_LENGTH",
    "MAX_VERSION_LENGTH",
    "MAX_WORKFLOW_ID_LENGTH",
    "check_event_type",
    "check_events_call",
    "check_export_target",
    "check_hook_name",
    "check_idempotency_key",
    "check_import_call",
    "check_json",
    "check_list_call",
    "check_page_call",
    "check_purge_call",
    "check_run_call",
    "check_run_id",
    "check_signal_call",
    "check_signal_key",
    "check_signal_name",
    "check_stage_id",
    "check_start_call",
    "check_start_input",
    "check_step_name",
    "check_text",
    "check_version",
    "check_wait_call",
    "check_worker_options",
    "check_workflow_id",
    "check_workflow_ids",
    "definition_error",
    "safe_error_message",
]

# The native schema's column widths (the strictest backend); see driver_native/_schema.py.
MAX_RUN_ID_LENGTH = 64  # wfe_runs.id
MAX_WORKFLOW_ID_LENGTH = 200  # wfe_runs.workflow_id, wfe_definitions.workflow_id
MAX_STAGE_ID_LENGTH = 200  # wfe_stages.stage_id
MAX_VERSION_LENGTH = 100  # wfe_runs.version ("workflow@version" fits wfe_jobs.wfv, 310)
MAX_IDEMPOTENCY_KEY_LENGTH = 300  # wfe_runs.idempotency_key
MAX_SIGNAL_KEY_LENGTH = 300  # wfe_signal_queue.idempotency_key
# Names are journaled as step keys (wfe_steps.name, 500) and shown as "signal:<name>",
# "sleep:<name>", "poll:<name>" in waiting_for (300); hook steps are keyed
# "hook:<hook>:<n>:<handler>". 200 leaves room for every prefix.
MAX_SIGNAL_NAME_LENGTH = 200
MAX_STEP_NAME_LENGTH = 200
MAX_EVENT_TYPE_LENGTH = 200  # wfe_outbox.type, wfe_staged_events.type (300)
MAX_HOOK_NAME_LENGTH = 200  # hook points and hook handler names
MAX_TARGET_LENGTH = 100  # wfe_drains.target (a driver name)
MAX_JSON_DEPTH = 64  # nested objects/arrays in one JSON value
# digits of one JSON integer: CPython's default int/str conversion limit
# (``sys.get_int_max_str_digits``), which ``json``, SQLAlchemy and Temporal's converter obey
MAX_JSON_INT_DIGITS = 4300
_INT_BOUND = 10**MAX_JSON_INT_DIGITS  # the smallest integer of one digit more

_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")

Raise = Callable[[str, str], EngineError]


def _invalid(field: str, detail: str) -> EngineError:
    return InvalidInputError(None, detail, (field,))


def definition_error(field: str, detail: str) -> EngineError:
    """The ``error=`` for checks made when a workflow is declared or a hook registered: a
    definition over the limits is a :class:`DefinitionError` like any malformed graph."""
    return DefinitionError(detail)


def check_text(
    value: Any,
    field: str,
    limit: int,
    *,
    remedy: str = "use a shorter one",
    error: Raise = _invalid,
) -> str:
    """``value`` must be a non-empty string of at most ``limit`` characters that every backend
    can store (no NUL, no lone surrogate). Returns it."""
    if not isinstance(value, str):
        raise error(field, f"{field} must be a string, not {_kind(value)}")
    if not value:
        raise error(field, f"{field} is empty; give a non-empty string")
    if len(value) > limit:
        raise error(field, f"{field} is {len(value)} characters; the limit is {limit}; {remedy}")
    bad = _BAD_CHAR.search(value)
    if bad is not None:
        raise error(field, f"{field} {_bad_char(bad.group())}; remove it")
    return value


def check_run_id(run_id: Any) -> str:
    return check_text(
        run_id, "run id", MAX_RUN_ID_LENGTH, remedy="pass the id of a run (RunInfo.id)"
    )


_NEW_RUN_ID = re.compile(r"[A-Za-z0-9_-]+")


def check_new_run_id(run_id: Any) -> str:
    """A run id a caller chooses for a new run (a serverless ``CreateRun(run_id=...)``):
    letters, digits, '_' and '-' only. A run's blobs live under ``runs/<run id>/``: a '/'
    put one run's blobs inside another's prefix, '..' outside its own."""
    check_run_id(run_id)
    if not _NEW_RUN_ID.fullmatch(run_id):
        raise _invalid(
            "run_id",
            f"run id {run_id!r} may hold only letters, digits, '_' and '-'; leave it out to get "
            "a generated one",
        )
    return str(run_id)


def check_workflow_id(workflow_id: Any, *, error: Raise = _invalid) -> str:
    return check_text(workflow_id, "workflow id", MAX_WORKFLOW_ID_LENGTH, error=error)


def check_stage_id(stage_id: Any, *, error: Raise = _invalid) -> str:
    return check_text(stage_id, "stage id", MAX_STAGE_ID_LENGTH, error=error)


def check_version(version: Any, *, error: Raise = _invalid) -> str:
    return check_text(version, "version", MAX_VERSION_LENGTH, error=error)


def check_idempotency_key(key: Any) -> str | None:
    """A start's idempotency key: None, or a string of at most 300 characters."""
    if key is None:
        return None
    return check_text(
        key,
        "idempotency_key",
        MAX_IDEMPOTENCY_KEY_LENGTH,
        remedy="hash a longer key (e.g. sha256 hex), or pass None for no key",
    )


def check_signal_key(key: Any) -> str | None:
    """A signal's idempotency key: None, or a string of at most 300 characters."""
    if key is None:
        return None
    return check_text(
        key,
        "signal idempotency_key",
        MAX_SIGNAL_KEY_LENGTH,
        remedy="hash a longer key (e.g. sha256 hex), or pass None for no key",
    )


def check_signal_name(name: Any, *, error: Raise = _invalid) -> str:
    return check_text(name, "signal name", MAX_SIGNAL_NAME_LENGTH, error=error)


def check_step_name(name: Any) -> str:
    return check_text(name, "step name", MAX_STEP_NAME_LENGTH)


def check_event_type(type_: Any) -> str:
    return check_text(type_, "event type", MAX_EVENT_TYPE_LENGTH)


def check_hook_name(name: Any, field: str = "hook name", *, error: Raise = _invalid) -> str:
    return check_text(name, field, MAX_HOOK_NAME_LENGTH, error=error)


def check_export_target(target: Any) -> str:
    return check_text(target, "target driver", MAX_TARGET_LENGTH)


def check_workflow_ids(workflow_ids: Iterable[Any]) -> list[str]:
    """A list of workflow ids (``drain``, ``wfe move``). One id given as a string is refused,
    not read as a list of one-character ids."""
    if isinstance(workflow_ids, str | bytes) or not isinstance(workflow_ids, Iterable):
        raise _invalid(
            "workflow_ids",
            f"workflow_ids must be a list of workflow ids (e.g. ['order']), not "
            f"{_kind(workflow_ids)}",
        )
    return [check_workflow_id(w) for w in workflow_ids]


def check_json(value: Any, field: str, *, error: Raise = _invalid) -> Any:
    """Plain JSON data (as :func:`engine_port._serde.to_json_value` returns) that every backend
    can store: no NUL character or lone surrogate in any string or key, no NaN/Infinity,
    string keys only, at most :data:`MAX_JSON_DEPTH` levels of nesting. Returns ``value``."""
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, dict | list | tuple):
            stack.extend(_json_children(v, field, path, depth, error))
        else:
            _check_json_scalar(v, field, path, error)
    return value


def _check_json_scalar(v: Any, field: str, path: str, error: Raise) -> None:
    if isinstance(v, str):
        bad = _BAD_CHAR.search(v)
        if bad is not None:
            raise error(field, f"{_at(field, path)} {_bad_char(bad.group())}; remove it")
    elif isinstance(v, bool) or v is None:
        return
    elif isinstance(v, int):
        # (bit_length first: 14,000 bits are at most 4,215 digits, and the comparison with
        # the bound costs more than the check of every ordinary integer)
        if v.bit_length() > 14_000 and abs(v) >= _INT_BOUND:
            raise error(
                field,
                f"{_at(field, path)} is an integer of more than {MAX_JSON_INT_DIGITS} digits, "
                "which Python's JSON readers refuse (its int/str conversion limit); send it "
                "as a string",
            )
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise error(
                field,
                f"{_at(field, path)} is {v!r}, which JSON cannot carry; use a finite "
                "number or None",
            )
    else:
        raise error(field, f"{_at(field, path)} is a {_kind(v)}, which is not JSON data")


def _too_deep(field: str, error: Raise) -> EngineError:
    return error(
        field,
        f"{field} is nested more than {MAX_JSON_DEPTH} levels deep; the limit is "
        f"{MAX_JSON_DEPTH}; flatten it",
    )


def _json_children(
    v: dict[Any, Any] | list[Any] | tuple[Any, ...], field: str, path: str, depth: int, error: Raise
) -> list[tuple[Any, str, int]]:
    """The items of a JSON object or array, each with its path, once its keys are checked."""
    if depth >= MAX_JSON_DEPTH:
        raise _too_deep(field, error)
    if not isinstance(v, dict):
        return [(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(v)]
    children = []
    for k, item in v.items():
        if not isinstance(k, str):
            raise error(field, f"{_at(field, path)} has a {_kind(k)} key; use string keys")
        bad = _BAD_CHAR.search(k)
        if bad is not None:
            raise error(
                field,
                f"a key of {_at(field, path)} {_bad_char(bad.group())}; remove it",
            )
        children.append((item, f"{path}.{_short(k)}", depth + 1))
    return children


def _bad_char(ch: str) -> str:
    if ch == "\x00":
        return "contains a NUL character (\\x00), which PostgreSQL cannot store"
    return (
        f"contains a lone surrogate (\\u{ord(ch):04x}), which is not valid Unicode and cannot "
        "be stored as UTF-8"
    )


def _at(field: str, path: str) -> str:
    return field if path == "$" else f"{field} at {path}"


def _short(key: str) -> str:
    shown = key if len(key) <= 40 else key[:40] + "..."
    return _BAD_CHAR.sub("?", shown)


def _kind(value: Any) -> str:
    return "None" if value is None else type(value).__name__


# -- the public calls: every driver calls these first ------------------------------------------


def check_start_call(workflow_id: Any, idempotency_key: Any, version: Any) -> None:
    """The arguments of ``engine.start`` (the input is checked by :func:`check_start_input`
    once it has been validated into the workflow's input model)."""
    check_workflow_id(workflow_id)
    check_idempotency_key(idempotency_key)
    if version is not None:
        check_version(version)


def check_start_input(workflow: Workflow[Any], input: Any) -> JSON:
    """The run input as stored: validated into the workflow's input model, dumped to JSON
    and checked against the limits. Raises InvalidInputError."""
    value = workflow.validate_input(input).model_dump(mode="json")
    return check_json(value, "input")


_STATUSES = ", ".join(s.value for s in RunStatus)


def check_list_call(workflow_id: Any, status: Any, limit: Any, id_prefix: Any) -> list[RunStatus]:
    """The arguments of ``engine.list_runs`` (and a driver's ``list_runs_page``); returns the
    statuses asked for (empty: any status). A misspelled status is an error, not an empty
    listing; ``limit`` is a whole number, 0 or more (0 lists nothing)."""
    if workflow_id is not None:
        check_workflow_id(workflow_id)
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise _invalid("limit", f"limit must be a whole number of runs, not {_kind(limit)}")
    if limit < 0:
        raise _invalid("limit", "limit is negative; give 0 or more runs")
    if id_prefix is not None and not isinstance(id_prefix, str):
        raise _invalid("id_prefix", f"id_prefix must be a string, not {_kind(id_prefix)}")
    bad = None if id_prefix is None else _BAD_CHAR.search(id_prefix)
    if bad is not None:  # (PostgreSQL and Temporal's visibility raised raw errors)
        raise _invalid("id_prefix", f"id_prefix {_bad_char(bad.group())}; remove it")
    given = [status] if isinstance(status, str) else status
    if given is None:
        return []
    if not isinstance(given, Sequence | AbstractSet) or isinstance(given, bytes):
        raise _invalid(
            "status", f"status must be a run status or a list of them, not {_kind(given)}"
        )
    wanted: list[RunStatus] = []
    for one in given:
        try:
            wanted.append(RunStatus(one))
        except ValueError:
            raise _invalid(
                "status", f"a status asked for is not a run status; use one of {_STATUSES}"
            ) from None
    return wanted


def check_page_call(
    after: Any, version: Any, created_after: Any, idempotency_key: Any
) -> datetime | None:
    """The arguments a driver's ``list_runs_page`` adds to :func:`check_list_call`; returns
    ``created_after`` with a time zone (a naive one is taken as UTC, as Temporal's clock is,
    whatever the host's zone). A cursor or a date of the wrong type raised an AttributeError
    from inside the driver, a version or key of the wrong type listed nothing."""
    if after is not None and not isinstance(after, str):
        raise _invalid(
            "after", f"after must be the cursor string the previous page gave, not {_kind(after)}"
        )
    if version is not None:
        check_version(version)
    if idempotency_key is not None:
        check_idempotency_key(idempotency_key)
    if created_after is None:
        return None
    if not isinstance(created_after, datetime):
        raise _invalid(
            "created_after",
            f"created_after must be a datetime (e.g. datetime.now(UTC) - timedelta(hours=1)), "
            f"not {_kind(created_after)}",
        )
    return created_after if created_after.tzinfo else created_after.replace(tzinfo=UTC)


def check_events_call(run_id: Any, after_seq: Any, limit: Any) -> str:
    """The arguments of a driver's ``events(run_id, after_seq=, limit=)``: the events of
    the run with a sequence number above ``after_seq`` (None: from the first), at most
    ``limit`` of them (None: all). ``after_seq`` is a whole number, 0 or more (the ``seq``
    of the last event of the previous page), ``limit`` a whole number, 1 or more (a page
    of 0 events never moves a page loop on). Returns the run id."""
    checked = check_run_id(run_id)
    if after_seq is not None:
        if isinstance(after_seq, bool) or not isinstance(after_seq, int):
            raise _invalid(
                "after_seq",
                "after_seq must be a whole number (the seq of the last event of the previous "
                f"page) or None, not {_kind(after_seq)}",
            )
        if after_seq < 0:
            raise _invalid(
                "after_seq",
                f"after_seq is negative ({after_seq}); give 0 or more (the seq of the last "
                "event already read), or None to start at the first event",
            )
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise _invalid(
                "limit", f"limit must be a whole number of events or None, not {_kind(limit)}"
            )
        if limit < 1:
            raise _invalid(
                "limit", f"limit must be 1 or more events, not {limit}; or None for all of them"
            )
    return checked


def check_wait_call(run_id: Any, timeout: Any) -> float | None:
    """The arguments of ``engine.wait``; returns the timeout in seconds (None: as long as it
    takes, which infinity also means). Raises InvalidInputError for a timeout that is not a
    number of seconds, 0 or more."""
    check_run_id(run_id)
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise _invalid(
            "timeout", f"timeout must be seconds (a number) or None, not {_kind(timeout)}"
        )
    if math.isnan(timeout) or timeout < 0:
        raise _invalid(
            "timeout", "timeout must be 0 or more seconds, or None to wait as long as it takes"
        )
    return None if math.isinf(timeout) else float(timeout)


def check_wait_seconds(value: Any, name: str = "wait") -> float:
    """How long a migration call waits (``export_run(wait=)``, ``migrate_runs(wait=,
    drain_timeout=)``): seconds, 0 or more (infinity: as long as it takes). NaN made the
    deadline one that never passes -- a hang while a stage ran, a drain that never ended --
    and a string raised a bare TypeError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid(name, f"{name} must be a number of seconds, not {_kind(value)}")
    if math.isnan(value) or value < 0:
        raise _invalid(name, f"{name} must be 0 or more seconds, not {value}")
    return float(value)


def check_import_call(snapshot: Any) -> RunSnapshot:
    """The argument of ``engine.import_run``: the ``RunSnapshot`` that ``export_run`` returned,
    or its JSON form (``snapshot.model_dump(mode="json")``, e.g. read back from a file).
    Anything else raised an AttributeError from inside the driver."""
    if isinstance(snapshot, Mapping):
        try:
            snapshot = RunSnapshot.model_validate(snapshot)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "<root>"
            raise _invalid(
                "snapshot",
                f"snapshot is not a run snapshot ({where}: {first['msg']}); pass what "
                "export_run() returned, or its model_dump(mode='json')",
            ) from None
    if not isinstance(snapshot, RunSnapshot):
        raise _invalid(
            "snapshot",
            f"snapshot must be the RunSnapshot that export_run() returned, not {_kind(snapshot)}",
        )
    check_run_id(snapshot.run_id)
    if not _NEW_RUN_ID.fullmatch(snapshot.run_id):
        # (every driver makes run ids of these only; an edited one, "<other run>/x" or "..",
        # put the run's blobs inside another run's prefix, which its purge deleted, or
        # outside its own)
        raise _invalid(
            "snapshot",
            f"snapshot run id {snapshot.run_id!r} may hold only letters, digits, '_' and '-', "
            "as every driver's run ids do; import the snapshot export_run() gave, unedited",
        )
    return snapshot


def check_purge_call(older_than: Any) -> float:
    """The argument of ``engine.purge``: how long ago a run must have finished to go, a
    ``timedelta`` or seconds, finite and 0 or more; returns it in seconds. A negative age
    would have purged every finished run (the cutoff in the future), a string or None
    raised a bare ValueError or TypeError."""
    if isinstance(older_than, timedelta):
        seconds = older_than.total_seconds()
    elif isinstance(older_than, int | float) and not isinstance(older_than, bool):
        seconds = float(older_than)
    else:
        raise _invalid(
            "older_than",
            f"older_than must be a timedelta or a number of seconds (e.g. timedelta(days=7)), "
            f"not {_kind(older_than)}",
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise _invalid(
            "older_than",
            f"older_than must be 0 or more (and finite), not {seconds}: runs that finished "
            "longer ago than this are purged",
        )
    return seconds


def check_worker_options(
    driver: str,
    options: Mapping[str, Any],
    numbers: Mapping[str, tuple[bool, float]],
    others: Iterable[str] = (),
) -> None:
    """The options of ``engine.worker(**options)``: each a name the driver's worker takes
    (``numbers`` and ``others``: code moving between drivers got a bare TypeError), and each
    number option (``name -> (whole, minimum)``) a finite number, a whole one when ``whole``,
    of at least ``minimum``; None keeps the default. ``concurrency=-1`` started a worker that
    never ran a stage, a negative poll interval one that polled without a pause."""
    known = sorted({*numbers, *others})
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise _invalid(
            "options",
            f"the {driver} driver's worker takes {', '.join(known)}; not {', '.join(unknown)}",
        )
    check_numbers(
        {
            name: (options[name], whole, minimum)
            for name, (whole, minimum) in numbers.items()
            if options.get(name) is not None
        }
    )


def check_numbers(values: Mapping[str, tuple[Any, bool, float]]) -> None:
    """Number arguments, ``name -> (value, whole, minimum)``: each a finite number (a whole
    one when ``whole``; never a bool) of at least ``minimum``, else InvalidInputError naming
    it (a string was a bare TypeError from inside, ``1.5`` jobs ran two, a negative age
    purged everything)."""
    for name, (value, whole, minimum) in values.items():
        if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
            what = "a whole number" if whole else "a number of seconds"
            raise _invalid(name, f"{name} must be {what}, not {_kind(value)}")
        if not math.isfinite(value) or value < minimum:
            raise _invalid(name, f"{name} must be {minimum:g} or more, not {value}")


def check_run_call(run_id: Any) -> str:
    """The run id of ``get_run``, ``wait``, ``cancel``, ``redrive``, ``export_run``..."""
    return check_run_id(run_id)


def check_signal_call(run_id: Any, name: Any, payload: Any, idempotency_key: Any) -> JSON:
    """The arguments of ``engine.signal``; returns the payload as JSON data."""
    check_run_id(run_id)
    check_signal_name(name)
    check_signal_key(idempotency_key)
    return _caller_json(payload, "signal payload")


def _caller_json(value: Any, field: str) -> JSON:
    """A JSON value a caller gives the engine (a signal payload), as JSON data: pydantic
    models and dataclasses converted; nested too deep, NaN/Infinity or not JSON at all is
    ``InvalidInputError`` (the caller's input), never the ``SerializationError`` meant for
    what a stage returns."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:  # (before the conversion, which gives up deep down with a vaguer error)
        v, depth = stack.pop()
        if isinstance(v, dict | list | tuple):
            if depth >= MAX_JSON_DEPTH:
                raise _too_deep(field, _invalid)
            stack.extend((item, depth + 1) for item in (v.values() if isinstance(v, dict) else v))
    try:
        plain = to_json_value(value, field)
    except SerializationError as exc:
        raise _invalid(field, f"{exc}; send JSON data") from None
    return check_json(plain, field)


# -- error records --------------------------------------------------------------------------

_DB_MODULES = ("sqlalchemy", "psycopg", "sqlite3", "asyncpg", "pg8000", "psycopg2")
_SQL_MARKERS = ("[SQL:", "[parameters:", "(Background on this error at:")


def _is_db_error(exc: BaseException) -> bool:
    return any((c.__module__ or "").split(".")[0] in _DB_MODULES for c in type(exc).__mro__[:-2])


def safe_error_message(exc: BaseException) -> str:
    """The message to store for ``exc``: ``str(exc)``, except that a database error's SQL
    text, parameters and row details are left out (they may carry user data: a step result,
    a card number). A SQLAlchemy error is described by its driver error's first line."""
    if _is_db_error(exc):
        orig = getattr(exc, "orig", None)
        if isinstance(orig, BaseException):
            first = _first_line(str(orig))
            return f"({type(orig).__module__}.{type(orig).__name__}) {first}".strip()
        return _strip_sql(_first_line(_text(exc)))
    message = _strip_sql(_text(exc))
    if len(message) > MAX_ERROR_MESSAGE:  # (a multi-megabyte message stuck a Temporal run)
        cut = len(message) - MAX_ERROR_MESSAGE
        message = f"{message[:MAX_ERROR_MESSAGE]}... ({cut:,} more characters cut)"
    return message


MAX_ERROR_MESSAGE = 8192
"""The longest error message stored for a failure (as its traceback): a bigger one is cut,
saying by how much (a 5 MB message went into every ``stage.failed`` event on native and
exceeded Temporal's payload limit, leaving the run running for ever)."""


def _text(exc: BaseException) -> str:
    """``str(exc)``; an exception whose ``__str__`` raises is described instead of failing
    the record of the attempt (it left the run running for ever)."""
    try:
        return str(exc)
    except Exception as err:
        return f"<{type(exc).__name__}: str() raised {type(err).__name__}>"


# PostgreSQL quotes the rejected value at the end of some messages ('invalid input syntax for
# type integer: "4111..."'): a database error's quoted tail is left out too.
_QUOTED_TAIL = re.compile(r':\s*".*"\s*$')


def _first_line(message: str) -> str:
    first = (message.strip().splitlines() or [""])[0]
    return _QUOTED_TAIL.sub(": (value left out)", first)


def _strip_sql(message: str) -> str:
    cut = min((i for m in _SQL_MARKERS if (i := message.find(m)) >= 0), default=-1)
    if cut < 0:
        return message
    # a database error's text inside another message: keep its first lines, not its details
    kept = [
        _QUOTED_TAIL.sub(": (value left out)", line)
        for line in message[:cut].rstrip().splitlines()
        if not line.lstrip().startswith(("DETAIL:", "HINT:", "CONTEXT:"))
    ]
    return "\n".join(kept) + " [SQL and parameters left out]"
