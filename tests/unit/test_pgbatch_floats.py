"""``_pgbatch._values`` writes a float as its own literal, also when the float written before
it (kept with its literal, for a transaction's time repeated in its statements) is equal to it
but another object (``0.0`` and ``-0.0``) or not equal to itself (NaN)."""

from __future__ import annotations

from typing import Any

from driver_native._pgbatch import _values


class _State:
    plain = True
    strs: dict[type, bool] = {}

    def __init__(self) -> None:
        self.float: tuple[float | None, bytes] = (None, b"")

    def quote(self, value: Any) -> bytes:
        raise AssertionError(value)


def test_each_float_is_written_as_its_own_literal() -> None:
    state: Any = _State()
    now = 1796517163.218996
    params = {"a": now, "b": now, "c": -0.0, "d": 0.0, "e": float("nan"), "f": now, "g": 0.5}
    order = tuple(params)
    want = b"'1796517163.218996', '1796517163.218996', '-0.0', '0.0', 'nan', "
    want += b"'1796517163.218996', '0.5')"
    assert _values(state, params, order) == want
    assert _values(state, params, order) == want  # (the kept one from the call before)
    assert _values(state, {"x": 0.0, "y": -0.0, "z": 0.0}, ("x", "y", "z")) == (
        b"'0.0', '-0.0', '0.0')"
    )
