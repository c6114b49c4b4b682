"""PostgreSQL: several statements of a transaction in one simple query (one round trip).

psycopg's pipeline mode also sends several statements in one round trip, but it costs ~48 us
of client CPU per statement queued and more per sync (bench/README.md, 2026-12-01 late): about
as much as the statement itself. Here the statements go out as one multi-statement text of the
simple query protocol, values bound client-side by psycopg's ``ClientCursor.mogrify`` (its own
quoting, for the connection's encoding). So that the server does not parse and plan each one
anew, a statement is prepared on its connection once (``PREPARE``, which PostgreSQL keeps
whatever becomes of the transaction it ran in) and then sent as ``EXECUTE name(values)``.

The server runs the statements in order and stops at the first error; the caller's transaction
is then aborted, as with the statements one at a time.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["PLAN_EACH_TIME", "send_batch", "send_commit"]

Deferred = tuple[str, Any, bool]
"""A deferred write: SQL (psycopg's ``%(name)s`` placeholders), parameters, executemany."""

MAX_PREPARED = 256
"""Statements prepared per connection at most (the server keeps a plan for each); past that,
statements go out with their values inline (parsed and planned each time)."""

_STATE = "wfe_prepared"
"""``conn.info`` key: the :class:`_Prepared` of the connection's DBAPI connection."""


class _Prepared:
    """The statements prepared on one DBAPI connection (SQL text -> ``EXECUTE name(`` and
    the order of its parameters), and how values are written as literals for it
    (:meth:`quote`)."""

    __slots__ = (
        "float",
        "json",
        "json_dumps",
        "literal",
        "names",
        "next",
        "plain",
        "raw",
        "strs",
    )

    def __init__(self, raw: Any) -> None:
        from psycopg.adapt import PyFormat, Transformer
        from psycopg.types.json import Json, Jsonb

        self.raw = raw
        self.literal = Transformer(raw)
        self.names: dict[str, tuple[bytes, tuple[str, ...]]] = {}
        self.next = 0  # names are never reused: a failed batch may or may not have made some
        # quoted here, as psycopg would, when a string literal is plain '...' with its quotes
        # doubled (standard_conforming_strings on: a backslash is itself) in UTF-8
        info = raw.info
        self.plain = (
            info.parameter_status("standard_conforming_strings") == "on"
            and info.encoding == "utf-8"
        )
        self.json = {Json: b"'::json", Jsonb: b"'::jsonb"}
        dumper: Any = self.literal.get_dumper(Json(None), PyFormat.TEXT)
        self.json_dumps: Callable[[Any], str | bytes] = dumper.dumps  # (the connection's)
        # types not written by :meth:`quote` itself: which of them psycopg writes as a str
        self.strs: dict[type, bool] = {}
        # the last float written by _values and its literal: a transaction's time is the same
        # float object in most of its statements, and writing one out costs ~0.4 us
        self.float: tuple[float | None, bytes] = (None, b"")

    def quote(self, value: Any) -> bytes:
        """``value`` as a literal of the statement text: the common types (a str or a str
        enum, an int, a float, None, a bool, a JSON document, a list of strings and booleans)
        written here, as psycopg's ``as_literal`` writes them, at a fraction of its cost;
        anything else by psycopg."""
        kind = type(value)
        if kind is str:
            text: str = value
            if self.plain and "\x00" not in text:
                return ("'" + text.replace("'", "''") + "'").encode()
        elif kind is int:
            return b" %d" % value  # (the space: a negative number never follows a '-')
        elif kind is float:
            return _float(value)
        elif value is None:
            return b"NULL"
        elif kind is bool:
            return b"true" if value else b"false"
        elif kind is list and self.plain:
            array = _array(value)
            if array is not None:
                return ("'" + array.replace("'", "''") + "'").encode()
        elif kind in self.json and self.plain and value.dumps is None:
            data = self.json_dumps(value.obj)
            text = data if isinstance(data, str) else bytes(data).decode()
            if "\x00" not in text:
                return ("'" + text.replace("'", "''")).encode() + self.json[kind]
        elif self.plain and self._as_str(kind, value) and "\x00" not in value:
            return ("'" + str.replace(value, "'", "''") + "'").encode()  # (its value)
        literal: bytes = self.literal.as_literal(value)
        return literal

    def _as_str(self, kind: type, value: Any) -> bool:
        """Whether psycopg writes values of ``kind`` (other than the types :meth:`quote`
        writes) as it writes a str: a subclass of str (a ``StrEnum``) it has no dumper of its
        own for."""
        known = self.strs.get(kind)
        if known is None:
            from psycopg.adapt import PyFormat

            literal = self.literal
            known = self.strs[kind] = issubclass(kind, str) and type(
                literal.get_dumper(value, PyFormat.TEXT)
            ) is type(literal.get_dumper("", PyFormat.TEXT))
        return known


def _element(value: Any) -> str | None:
    if type(value) is str:
        text: str = value
        if "\x00" in text:
            return None
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if value is None:
        return "NULL"
    if type(value) is bool:
        return "t" if value else "f"
    return None


def _array(values: list[Any]) -> str | None:
    """The text of an array of strings, NULLs and booleans (``{"a",NULL,t}``: each string
    quoted, its backslashes and double quotes escaped), or None for any other element."""
    elements = []
    for value in values:
        element = _element(value)
        if element is None:
            return None
        elements.append(element)
    return "{" + ",".join(elements) + "}"


def _state(info: dict[Any, Any], raw: Any) -> _Prepared:
    state: _Prepared | None = info.get(_STATE)
    if state is None or state.raw is not raw:  # (a new connection behind the same record)
        state = info[_STATE] = _Prepared(raw)
    return state


_PLACEHOLDER = re.compile(r"%\(([^)]+)\)s|%%")
_DDL = re.compile(r"\s*(ALTER|DROP|CREATE)\b", re.IGNORECASE)
_PREPARABLE = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|VALUES)\b", re.IGNORECASE)

PLAN_EACH_TIME = "/* wfe: planned for its values */"
"""A statement with this comment (``select.prefix_with(PLAN_EACH_TIME)``) is not prepared: it
goes out with its values inline, planned for them at each execution. For a statement whose one
generic plan can be ruinous: one over a table whose statistics lag its size (the outbox's look
for due events, on a backlog autovacuum has not analyzed yet, compared every undelivered event
with every other: 25-50 s at 100,000 events)."""


@functools.lru_cache(maxsize=1024)
def _numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with ``$1``, ``$2``, ... for its named placeholders, and their names in order."""
    order: dict[str, int] = {}  # (a dict: a statement may have thousands, an IN list)

    def number(m: re.Match[str]) -> str:
        name = m.group(1)
        if name is None:
            return "%"
        return f"${order.setdefault(name, len(order) + 1)}"

    return _PLACEHOLDER.sub(number, sql), tuple(order)


def _float(value: float) -> bytes:
    """A float as a quoted literal: psycopg writes ``-0.0`` bare, which the server reads as
    the numeric 0 (the sign lost); quoted, it is read by the parameter's type, exactly."""
    return b"'%r'" % value  # (``%r`` of bytes: the float's ``ascii()``, its repr)


def _values(state: _Prepared, params: Mapping[str, Any], order: tuple[str, ...]) -> bytes:
    """The values of ``order`` in ``params``, quoted (:meth:`_Prepared.quote`, with its
    commonest cases written out here: a call less per value), then ``)``."""
    quote, plain, strs = state.quote, state.plain, state.strs
    last, last_text = state.float
    out = []
    for key in order:
        value = params[key]
        kind = type(value)
        if kind is str and plain and "\x00" not in value:
            out.append(("'" + value.replace("'", "''") + "'").encode())
        elif kind is int:
            out.append(b" %d" % value)  # (the space: a negative number never follows a '-')
        elif value is None:
            out.append(b"NULL")
        elif kind is float:
            if value is not last:  # (the same object: the same literal)
                last, last_text = value, b"'%r'" % value  # (as :func:`_float`)
                state.float = (last, last_text)
            out.append(last_text)
        elif kind is bool:
            out.append(b"true" if value else b"false")
        elif plain and strs.get(kind) and "\x00" not in value:  # (a str enum seen before)
            out.append(("'" + str.replace(value, "'", "''") + "'").encode())
        else:
            out.append(quote(value))
    return b", ".join(out) + b")"


class _Text:
    """Builds one batch: its statements, and the PREPAREs they need (sent first)."""

    def __init__(self, cursor: Any, info: dict[Any, Any]) -> None:
        self.cursor = cursor
        self.state = _state(info, cursor.connection)
        self.prepares: list[bytes] = []
        self.fresh: dict[str, tuple[bytes, tuple[str, ...]]] = {}
        self.parts: list[bytes] = []
        self.ddl = False  # a table is changed: prepare statements anew after it

    def add(self, sql: str, params: Any) -> None:
        prepared = self.state.names.get(sql)
        if prepared is not None and type(params) is dict:  # (the common case)
            self.parts.append(prepared[0] + _values(self.state, params, prepared[1]))
            return
        if params is None:
            self.parts.append(sql.encode())
            return
        if not isinstance(params, Mapping):  # (positional %s placeholders)
            self._inline(sql, params)
            return
        numbered, order = _numbered(sql)
        if not order:
            self.parts.append(numbered.encode())  # (nothing to bind: COMMIT, DDL)
            self.ddl = self.ddl or bool(_DDL.match(sql))
            return
        preparable = _PREPARABLE.match(sql) and PLAN_EACH_TIME not in sql
        execute = self._name(sql, order) if preparable else None
        if execute is None:
            self._inline(sql, params)
            return
        self.parts.append(execute + _values(self.state, params, order))

    def _inline(self, sql: str, params: Any) -> None:
        """The statement with its values written in (parsed and planned each time)."""
        import psycopg

        literal = psycopg.ClientCursor(self.cursor.connection)
        self.parts.append(literal.mogrify(sql, params).encode())

    def _name(self, sql: str, order: tuple[str, ...]) -> bytes | None:
        """``EXECUTE name(`` of the statement prepared for ``sql`` (None: too many)."""
        state = self.state
        known = state.names.get(sql) or self.fresh.get(sql)
        if known is not None:
            return known[0]
        if len(state.names) + len(self.fresh) >= MAX_PREPARED:
            return None
        name = f"wfe_{state.next}"
        state.next += 1
        execute = f"EXECUTE {name}(".encode()
        self.fresh[sql] = (execute, order)
        self.prepares.append(f"PREPARE {name} AS {_numbered(sql)[0]}".encode())
        return execute

    def text(self, head: Sequence[bytes]) -> tuple[bytes, int]:
        """The whole text (PREPAREs, ``head``, the statements added) and the number of results
        before the statements added."""
        return b"\n;\n".join([*self.prepares, *head, *self.parts]), len(self.prepares) + len(head)


def send_batch(
    cursor: Any,
    info: dict[Any, Any],
    tail: list[Deferred] | None,
    last: Sequence[tuple[str, Any]],
) -> None:
    """Send, in one round trip on ``cursor``: inside a transaction (``tail`` not None) BEGIN
    when it has not started yet and its deferred writes, in order (``tail`` is emptied); then
    ``last`` (SQL, parameters). The cursor is left on the result of the first of ``last``
    (``nextset()`` steps to the next). ``info``: the SQLAlchemy connection's ``info``."""
    for _ in range(_send(cursor, info, tail, last)):
        cursor.nextset()


def send_commit(cursor: Any, info: dict[Any, Any], tail: list[Deferred]) -> None:
    """:func:`send_batch` of the transaction's deferred writes ``tail`` and COMMIT, whose
    results nobody reads (an error among them is raised all the same)."""
    _send(cursor, info, tail, [("COMMIT", None)])


def _send(
    cursor: Any,
    info: dict[Any, Any],
    tail: list[Deferred] | None,
    last: Sequence[tuple[str, Any]],
) -> int:
    """:func:`send_batch` up to its results: returns how many come before those of ``last``."""
    from psycopg.pq import TransactionStatus

    batch = _Text(cursor, info)
    head: list[bytes] = []
    if tail is not None:
        if cursor.connection.info.transaction_status == TransactionStatus.IDLE:
            head.append(b"BEGIN")
        for sql, params, many in tail:
            for one in params if many else [params]:
                batch.add(sql, one)
        tail.clear()
        head += batch.parts
        batch.parts = []
    for sql, params in last:
        batch.add(sql, params)
    text, ahead = batch.text(head)
    cursor.execute(text)  # (no parameters: the simple query protocol, several statements)
    if batch.ddl:
        # (as psycopg does: a plan prepared before may no longer fit; the old statements stay
        # on the server, unused, until the connection closes)
        batch.state.names.clear()
    else:  # (only now: a failed batch may not have made them)
        batch.state.names.update(batch.fresh)
    return ahead
