"""Hot-path statements compiled once per dialect and executed on the DBAPI cursor.

A SQLAlchemy Core statement built once (``functools.cache``, ``bindparam``) still pays
SQLAlchemy's execute path on every call: the compiled-cache lookup, an execution context,
parameter processing and a result object, about 10 us per statement and most of a
transaction's CPU (bench/README.md, issue 12). :func:`execute` compiles such a statement once
per dialect (the SQL text, the parameter order, the bind and result type processors) and
runs it straight on the driver's cursor; rows come back as named tuples.

What stays as with ``conn.execute``: ``before_cursor_execute`` listeners see every statement
(the statement counters of txcount and the tests), DBAPI errors are wrapped and handled by
SQLAlchemy (connection invalidation, the retry in ``_db``), and on PostgreSQL a write whose
result nobody reads can be deferred into the transaction's next round trip (``_db.defer``).
Statements SQLAlchemy renders per call (expanding ``IN`` lists) are refused: they keep
``conn.execute``."""

from __future__ import annotations

import functools
import operator
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement

from ._db import PREPARED, cursors, forget_cursors, queue_later, send_raw, send_together

__all__ = ["Rows", "execute", "execute_many", "execute_together", "fetched"]


class _Prepared:
    __slots__ = (
        "_dialect",
        "_result_procs",
        "_types",
        "compiled",
        "fixed",
        "names",
        "pick",
        "procs",
        "returns_rows",
        "row",
        "sql",
    )

    def __init__(self, stmt: ClauseElement, dialect: Dialect) -> None:
        compiled: Any = stmt.compile(dialect=dialect)
        if compiled.literal_execute_params or compiled.post_compile_params:
            raise ValueError("statements rendered per call (expanding IN) need conn.execute")
        self.compiled = compiled
        self.sql: str = compiled.string
        self.names: tuple[str, ...] | None = (
            tuple(compiled.positiontup) if compiled.positional else None
        )
        # (positional: the values in the statement's order, picked in C)
        self.pick: Callable[[dict[str, Any]], tuple[Any, ...]] | None = (
            None if self.names is None else _picker(self.names)
        )
        # every parameter with the value the statement gives it (literals, or None)
        self.fixed: dict[str, Any] = dict(compiled.construct_params(_check=False))
        types = {name: bind.type for bind, name in compiled.bind_names.items()}
        self.procs: dict[str, Callable[[Any], Any]] = {
            k: _array_copy(p) if _plain_array(types.get(k), dialect) else p
            for k, p in compiled._bind_processors.items()
            if p is not None
        }
        columns = compiled._result_columns
        self.returns_rows = bool(columns)
        self.row: Any = _row_type(tuple(c.keyname for c in columns)) if columns else None
        self._dialect = dialect
        self._types = tuple(c.type for c in columns)
        # (the processors depend on the column types the driver reports: set at first use)
        self._result_procs: tuple[tuple[int, Callable[[Any], Any]], ...] | None = None

    def params(self, given: Mapping[str, Any]) -> Any:
        values = self.fixed.copy()
        values.update(given)
        for key, proc in self.procs.items():
            if key in values:
                values[key] = proc(values[key])
        if self.pick is None:
            return values
        return self.pick(values)

    def rows(self, raw: list[Any], cursor: Any) -> list[Any]:
        procs = self._result_procs
        if procs is None:
            # (the cursor's description is built anew on each read: only the first needs it)
            found = (
                (i, t._cached_result_processor(self._dialect, d[1]))
                for i, (t, d) in enumerate(zip(self._types, cursor.description, strict=True))
            )
            procs = self._result_procs = tuple((i, p) for i, p in found if p is not None)
        make = self.row._make
        if not procs:
            return [make(r) for r in raw]
        out = []
        for r in raw:
            values = list(r)
            for i, proc in procs:
                values[i] = proc(values[i])
            out.append(make(values))
        return out


def _plain_array(kind: Any, dialect: Dialect) -> bool:
    """Whether ``kind`` is PostgreSQL's ARRAY as SQLAlchemy binds it (its own bind
    processor) of an item type without a bind processor: then that processor only copies a
    value into a list, for a one-dimensional list at a cost of ~1 us (``_array_copy``)."""
    if not isinstance(kind, sa.ARRAY):
        return False
    impl: Any = kind.dialect_impl(dialect)
    return (
        type(impl).bind_processor is postgresql.ARRAY.bind_processor
        and impl.item_type.dialect_impl(dialect).bind_processor(dialect) is None
    )


def _array_copy(proc: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``proc``, an ARRAY's bind processor of items without one (``_plain_array``), with its
    commonest case written out: a list whose first element is not itself a list or a tuple
    (one dimension) becomes a copy of it, as ``proc`` makes; anything else goes to ``proc``."""

    def process(value: Any) -> Any:
        if type(value) is list and (not value or not isinstance(value[0], (list, tuple))):
            return value.copy()
        return proc(value)

    return process


def _picker(names: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """``values`` -> the values of ``names`` in that order, as a tuple."""
    if len(names) > 1:
        return operator.itemgetter(*names)
    if names:
        name = names[0]
        return lambda values: (values[name],)
    return lambda _values: ()


def _mapping(self: Any) -> dict[str, Any]:
    return dict(self._asdict())


@functools.cache
def _row_type(fields: tuple[str, ...]) -> Any:
    base = namedtuple("Row", fields, rename=True)  # type: ignore[misc]
    return type("Row", (base,), {"__slots__": (), "_mapping": property(_mapping)})


# (the dialect's statements compiled here are kept on it, under ``PREPARED``, and dropped
# when its database is disposed; a module-wide cache kept up to 4,096 of them with their
# dialects and compilers after their engines had closed, ~1,000 objects an engine in a
# process that made engine after engine, which every full garbage collection walked)
_MAX_PREPARED = 4096  # (a dialect's statements are built once; this bounds a caller's slip)


def _prepare(stmt: ClauseElement, dialect: Dialect) -> _Prepared:
    cache: dict[ClauseElement, _Prepared] | None = dialect.__dict__.get(PREPARED)
    if cache is None:
        cache = {}
        setattr(dialect, PREPARED, cache)
    prep = cache.get(stmt)
    if prep is None:
        if len(cache) >= _MAX_PREPARED:
            cache.clear()
        prep = cache[stmt] = _Prepared(stmt, dialect)
    return prep


class Rows:
    """What a statement returned: its rows (named tuples) and its row count."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def first(self) -> Any:
        return self._rows[0] if self._rows else None

    def all(self) -> list[Any]:
        return self._rows

    def scalar(self) -> Any:
        return self._rows[0][0] if self._rows else None

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)


_NO_ROWS = Rows([], -1)


def fetched(cursor: Any) -> list[Any]:
    """The rows a statement returned (a hook for tests that count the rows read)."""
    return list(cursor.fetchall())


def execute(
    conn: Connection, stmt: ClauseElement, params: Mapping[str, Any], *, later: bool = False
) -> Rows:
    """``conn.execute(stmt, params)`` for a statement built once; ``later``: a write whose
    result nobody reads (sent with the transaction's next statement on PostgreSQL, see
    ``_db.defer``; the returned ``Rows`` is then empty)."""
    prep = _prepare(stmt, conn.dialect)
    return _run(conn, prep, prep.params(params), later=later, many=False)


def execute_many(
    conn: Connection,
    stmt: ClauseElement,
    params: Sequence[Mapping[str, Any]],
    *,
    later: bool = False,
) -> None:
    """``conn.execute(stmt, [params, ...])`` for a statement without RETURNING built once
    (``later`` as in :func:`execute`)."""
    if not params:
        return
    prep = _prepare(stmt, conn.dialect)
    if prep.returns_rows:
        raise ValueError("execute_many does not read rows")
    _run(conn, prep, [prep.params(p) for p in params], later=later, many=True)


def _run(conn: Connection, prep: _Prepared, args: Any, *, later: bool, many: bool) -> Rows:
    sql = prep.sql
    cursor: Any = None
    try:
        if (conn._has_events or conn.engine._has_events) and (
            listeners := conn.dispatch.before_cursor_execute  # (an engine's other events)
        ):
            for fn in listeners:
                sql, args = fn(conn, None, sql, args, None, many)
        if later and queue_later(conn, sql, args, many=many):
            return _NO_ROWS  # (no cursor: nothing is read)
        cursor = cursors(conn, 1)[0]
        if not send_raw(conn, cursor, sql, args, later=later, many=many):
            return _NO_ROWS
        rows = prep.rows(fetched(cursor), cursor) if prep.returns_rows else []
        return Rows(rows, cursor.rowcount)
    except Exception as exc:
        forget_cursors(conn)
        conn._handle_dbapi_exception(exc, sql, args, cursor, None)
        raise  # (not reached: SQLAlchemy raises its wrapped error)


def execute_together(
    conn: Connection, calls: Sequence[tuple[ClauseElement, Mapping[str, Any]]]
) -> list[Rows]:
    """Several reads (or writes) that do not depend on each other's results, in this order:
    on PostgreSQL sent as one multi-statement query, one round trip for all (``execute`` for
    each elsewhere)."""
    preps = [_prepare(stmt, conn.dialect) for stmt, _ in calls]
    sent: list[tuple[Any, str, Any]] = []
    try:
        held = cursors(conn, len(calls))
        for prep, (_, params), cursor in zip(preps, calls, held, strict=True):
            sql, args = prep.sql, prep.params(params)
            if (conn._has_events or conn.engine._has_events) and (
                listeners := conn.dispatch.before_cursor_execute
            ):
                for fn in listeners:
                    sql, args = fn(conn, None, sql, args, None, False)
            sent.append((cursor, sql, args))
        out = []
        for prep, cursor in zip(preps, send_together(conn, sent), strict=True):
            rows = prep.rows(fetched(cursor), cursor) if prep.returns_rows else []
            out.append(Rows(rows, cursor.rowcount))
        return out
    except Exception as exc:
        sql, args = (sent[-1][1], sent[-1][2]) if sent else ("", None)
        forget_cursors(conn)
        conn._handle_dbapi_exception(exc, sql, args, None, None)
        raise  # (not reached: SQLAlchemy raises its wrapped error)
