"""Where the ``wfe`` command line writes: results to stdout (a table on a terminal; untruncated
tab-separated rows when piped; one JSON document, or JSON lines for listings, with ``--json``),
errors and progress to stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["console", "error_line", "errors", "json_line", "plain", "rows", "show_json", "when"]

# rich reads sys.stdout / sys.stderr when it writes, so a test runner's capture still works.
# No markup: what is printed holds user data (workflow and stage ids, error messages), which
# Rich would read as style tags (``a[b]`` printed ``a``; ``[/x]`` raised MarkupError)
console = Console(markup=False)  # results (stdout)
errors = Console(stderr=True, markup=False)  # errors and progress (stderr)


def error_line(message: str) -> None:
    """``error: <message>`` on stderr (the prefix in red on a terminal)."""
    errors.print(Text.assemble(("error:", "red"), " ", message), highlight=False, soft_wrap=True)


def json_line(value: Any) -> None:
    """One JSON document on one line of stdout."""
    if isinstance(value, BaseModel):
        text = value.model_dump_json()
    else:
        text = json.dumps(value, default=str)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


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
        console.print(table)
        return
    sys.stdout.write("\t".join(columns) + "\n")
    for row in body:
        sys.stdout.write("\t".join(c.replace("\t", " ").replace("\n", " ") for c in row) + "\n")
    sys.stdout.flush()


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
