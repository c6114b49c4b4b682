"""Where the ``wfe`` command line writes: results to stdout (a table on a terminal; untruncated
tab-separated rows when piped; one JSON document, or JSON lines for listings, with ``--json``),
errors and progress to stderr."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["console", "error_line", "errors", "json_line", "plain", "rows", "show_json", "when"]

# rich reads sys.stdout / sys.stderr when it writes, so a test runner's capture still works.
# No markup: what is printed holds user data (workflow and stage ids, error messages), which
# Rich would read as style tags (``a[b]`` printed ``a``; ``[/x]`` raised MarkupError)
# soft_wrap: a line of text is never cut into lines at the console's width (80 columns when
# piped: "applied: [1, ..., 14, \n15]"); tables still fit the terminal.
console = Console(markup=False, soft_wrap=True)  # results (stdout)
errors = Console(stderr=True, markup=False, soft_wrap=True)  # errors and progress (stderr)


def error_line(message: str) -> None:
    """``error: <message>`` on stderr (the prefix in red on a terminal)."""
    errors.print(Text.assemble(("error:", "red"), " ", message), highlight=False, soft_wrap=True)


def _out(text: str) -> None:
    """Write ``text`` to stdout now. When its reader has gone (``wfe runs | head -1``), stop
    quietly with exit 1, as Rich does for what it prints (``Console.on_broken_pipe``): the
    rest goes to /dev/null, so neither this write nor the flush at exit reports it (it was
    "unexpected BrokenPipeError ...; this is a bug")."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):  # (no file descriptor: a test runner)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None


def json_line(value: Any) -> None:
    """One JSON document on one line of stdout."""
    if isinstance(value, BaseModel):
        text = value.model_dump_json()
    else:
        text = json.dumps(value, default=str)
    _out(text + "\n")


def show_json(value: BaseModel | dict[str, Any], as_json: bool) -> None:
    """One JSON document: coloured on a terminal, plain when piped or with --json."""
    if as_json or not console.is_terminal:
        json_line(value)
    else:
        text = value.model_dump_json() if isinstance(value, BaseModel) else json.dumps(value)
        console.print_json(text)


def rows(columns: Sequence[str], body: Sequence[Sequence[str]], title: str | None = None) -> None:
    """A table on a terminal; untruncated tab-separated rows (with a header) when piped."""
    if console.is_terminal:
        table = Table(*columns, title=title)
        for row in body:
            table.add_row(*row)
        if _narrowest(columns, body) <= console.width:
            console.print(table)
        else:  # too narrow: Rich cut every value to "…" (run ids too); one record per row
            _records(columns, body, title)
        return
    lines = [columns, *([c.replace("\t", " ").replace("\n", " ") for c in row] for row in body)]
    _out("".join("\t".join(line) + "\n" for line in lines))


def _narrowest(columns: Sequence[str], body: Sequence[Sequence[str]]) -> int:
    """The width a table needs to show every value whole (its longest words fit; Rich wraps
    at spaces): each column's longest word, its padding and rules."""
    widest = [
        max(
            (cell_len(w) for cell in (c, *(row[i] for row in body)) for w in cell.split()),
            default=1,
        )
        for i, c in enumerate(columns)
    ]
    return sum(widest) + 3 * len(columns) + 1


def _records(columns: Sequence[str], body: Sequence[Sequence[str]], title: str | None) -> None:
    """Rows as records, ``column  value`` on a line each, for a terminal narrower than the
    table (like psql's expanded display): every value is shown whole, folded if need be."""
    if title:
        console.print(Text(title, style="bold"))
    for i, row in enumerate(body):
        if i:
            console.print()
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for column, value in zip(columns, row, strict=False):
            grid.add_row(column, value)
        console.print(grid)
    if not body:
        console.print(Text("(none)", style="dim"))


def when(value: datetime | None) -> str:
    """A timestamp as ISO 8601 in UTC, to the second ("" for none)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value else ""


def plain(value: Any) -> Any:
    """Models (and lists of them) as JSON-ready values."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
