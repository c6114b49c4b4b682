"""``_rawsql``: a PostgreSQL ARRAY parameter of plain items is bound as SQLAlchemy binds it
(a copy, as a list), through the shortcut of its commonest case."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from driver_native._rawsql import _Prepared


@pytest.mark.parametrize(
    "value", [["a", "b"], [], ("a", None), [["a"], ["b"]], [("a",)], None, ["x'y", None]]
)
def test_an_array_parameter_is_bound_as_sqlalchemy_binds_it(value: Any) -> None:
    dialect = postgresql.psycopg.dialect()  # type: ignore[attr-defined]
    stmt = sa.select(sa.literal_column("1")).where(
        sa.bindparam("ids", type_=postgresql.ARRAY(sa.String)) == sa.bindparam("x")
    )
    ours = _Prepared(stmt, dialect).procs["ids"]
    theirs = stmt.compile(dialect=dialect)._bind_processors["ids"]
    assert ours is not theirs  # (the shortcut is in place)
    got, want = ours(value), theirs(value)
    assert got == want and type(got) is type(want)
    assert value is None or got is not value  # (a copy: a later change to value is not sent)
