"""``python -m bench [--quick] [--systems a,b] [--rounds N] [--out DIR]``: every system, every
workload, one process per system (so one system's crash or global state cannot touch another),
one machine, one run; then one table of ratios, ``latest.json`` and ``latest.png``.

With ``--rounds N`` the systems run N times, in the given order, then reversed, and so on
(A B C, C B A, A B ...), and each number is the median over the rounds: on a shared machine
whose speed drifts over minutes, a system measured only before or only after a slow spell is
what makes a ratio swing; alternated rounds put every system on both sides of it."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from ._common import WORKLOADS, combine_rounds
from ._report import check_goals, machine_info, markdown, print_tables, write_png
from ._systems import SYSTEMS

RESULTS = Path(__file__).resolve().parent / "results"


def run_system(name: str, quick: bool, timeout: float, console: Console) -> dict[str, Any]:
    """One system in a child process; a crash or a timeout becomes a recorded reason."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-") as d:
        out = Path(d) / "result.json"
        cmd = [sys.executable, "-m", "bench._systems", name, "quick" if quick else "full", str(out)]
        why: str | None = None
        # its own process group: a timeout ends the system's worker processes too (they were
        # left running, loading the machine for the systems measured after it)
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            if proc.returncode != 0 or not out.exists():
                tail = (stderr or stdout).strip().splitlines()[-1:] or ["no output"]
                why = f"exited {proc.returncode}: {tail[0][:300]}"
        except subprocess.TimeoutExpired:
            why = f"timed out after {timeout:g}s"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    if why is not None:
        for wl in WORKLOADS:
            result.setdefault(wl, {"error": why})
    if SYSTEMS[name].latency_only:
        result = {"latency": result.get("latency", {"error": why or "not run"})}
    bad = sum(1 for c in result.values() if "error" in c)
    console.print(
        f"  {name}: {time.perf_counter() - t0:.1f}s"
        + (f" [red]({bad} cell(s) could not run)[/red]" if bad else "")
    )
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="each workload once, at tiny size")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where latest.json/.png go")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per system")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the systems N times in alternating order; each number is the median",
    )
    ap.add_argument(
        "--report",
        action="store_true",
        help="measure nothing: print the tables (and Markdown) of OUT/latest.json",
    )
    args = ap.parse_args(argv)
    if args.report:
        doc = json.loads((args.out / "latest.json").read_text())
        doc["goals"] = check_goals(doc["results"])  # (the goals of this version of the code)
        print_tables(doc, Console(width=200))
        print(markdown(doc))
        return 0
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        ap.error(f"unknown systems {unknown}; choose from {list(SYSTEMS)}")
    timeout = args.timeout or (120.0 if args.quick else 420.0)
    console = Console(width=200)
    started = datetime.now(UTC)
    console.print(f"bench ({'quick' if args.quick else 'full'}): {len(names)} systems")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    rounds: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        if args.rounds > 1:
            console.print(f" round {r + 1} of {args.rounds}")
        for n in names if r % 2 == 0 else names[::-1]:
            rounds[n].append(run_system(n, args.quick, timeout, console))
    results = {
        n: runs[0] if args.rounds == 1 else combine_rounds(runs) for n, runs in rounds.items()
    }
    doc = {
        "mode": "quick" if args.quick else "full",
        "rounds": args.rounds,
        "started_at": started.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "command": "python -m bench"
        + (" --quick" if args.quick else "")
        + (f" --rounds {args.rounds}" if args.rounds > 1 else ""),
        "machine": machine_info(),
        "results": results,
    }
    doc["goals"] = check_goals(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(doc, indent=1, default=str))
    write_png(doc, args.out / "latest.png")
    print_tables(doc, console)
    console.print(f"wrote {args.out / 'latest.json'} and {args.out / 'latest.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
