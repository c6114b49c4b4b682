"""``python -m bench.tools.ab_swap --swap FILE:NAME [--swap ...] [--base REV] [--aa]
[--batches N] [--per N] [sqlite|postgres]``: an in-process A/B of a change to a few
functions of the engine, on 3-stage no-op runs of the native driver (in-process worker).

Side B is the working tree's code; side A is the same process with the named functions (a
module function ``NAME`` or a method ``Class.NAME``) taken from ``FILE`` as it is at ``--base``
(default ``HEAD``), compiled in a copy of their module's globals and swapped in. The two sides
alternate in batches of ``--per`` runs (A B, then B A, ...), so both meet the same load on a
shared host; each batch's process CPU per run and each run's latency are kept. Prints, per
side, the runs, the mean and median CPU a run and the p50 latency, then B/A of the mean CPU,
of the p50, and the median of the per-pair CPU ratios. ``--aa`` runs side A's code on both
sides: the harness's own noise, to read a B/A against (bench/README: on the shared 2-vCPU
host, separate processes cannot resolve a change under ~20 %; this resolves a few %).

Only functions looked up at call time through their module or class are swapped (not
references other modules imported by name before the swap); side A's are compiled without
their decorators (a ``functools.cache`` is not re-applied), except that a classmethod or a
staticmethod stays one."""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib
import statistics
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine_port import EngineSettings, create_engine

from .. import _workflows as W
from .._common import native_database
from .txcount import _backend_cpu, _backends_delta

ROOT = Path(__file__).resolve().parents[2]


def _old_source(path: str, qualname: str, base: str) -> str:
    """The source of ``qualname`` (``f`` or ``Class.f``) in ``path`` at ``base``, dedented,
    its decorators left out."""
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{base}:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    body: list[ast.stmt] = ast.parse(text).body
    node: Any = None
    for part in qualname.split("."):
        node = next(
            (n for n in body if getattr(n, "name", None) == part),
            None,
        )
        if node is None:
            raise SystemExit(f"{qualname} is not in {path} at {base}")
        body = getattr(node, "body", [])
    lines = text.splitlines()[node.lineno - 1 : node.end_lineno]  # (without decorators)
    return textwrap.dedent("\n".join(lines))


class Swap:
    """One function: its owner (module or class), its name, the working tree's and the
    base's version (each as the owner keeps it: a classmethod stays one)."""

    def __init__(self, spec: str, base: str) -> None:
        path, _, qualname = spec.partition(":")
        if not qualname:
            raise SystemExit(f"--swap {spec!r}: FILE:NAME (driver_native/_progress.py:f)")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        owner: Any = module
        *classes, self.name = qualname.split(".")
        for c in classes:
            owner = getattr(owner, c)
        self.owner = owner
        self.new = owner.__dict__[self.name]
        namespace = dict(vars(module))
        exec(compile(_old_source(path, qualname, base), f"<{base}:{spec}>", "exec"), namespace)
        old = namespace[self.name]
        if isinstance(self.new, classmethod | staticmethod):
            old = type(self.new)(old)
        self.old = old

    def use(self, old: bool) -> None:
        setattr(self.owner, self.name, self.old if old else self.new)


async def _batch(
    engine: Any, per: int, lat: list[float], server: list[float] | None = None, url: Any = None
) -> float:
    """``per`` runs one after the other; the process CPU a run. With ``server`` (PostgreSQL:
    ``url`` a connection to the engine's database), the CPU a run of the database's backends
    (``txcount._backend_cpu``) is appended to it."""
    before = _backend_cpu("", url) if server is not None else {}
    t0 = time.process_time()
    for _ in range(per):
        w = time.perf_counter()
        await engine.wait((await engine.start("bench-seq3", {})).id, timeout=60)
        lat.append(time.perf_counter() - w)
    cpu = (time.process_time() - t0) / per
    if server is not None:
        server.append(_backends_delta(before, _backend_cpu("", url)) / per)
    return cpu


async def measure(
    backend: str, swaps: list[Swap], batches: int, per: int, aa: bool
) -> dict[str, tuple[list[float], list[float]]]:
    """Side -> (CPU a run of each batch, latency of each run, on PostgreSQL the server's CPU
    a run of each batch: the engine database's backends)."""
    out: dict[str, tuple[list[float], list[float], list[float]]] = {
        "A": ([], [], []),
        "B": ([], [], []),
    }

    def use(side: str) -> None:
        for s in swaps:
            s.use(old=aa or side == "A")

    with native_database(backend) as url, tempfile.TemporaryDirectory() as blobs:
        settings = EngineSettings(database_url=url, blob_url=f"file://{blobs}")
        ask = None
        if backend == "postgres":
            import psycopg

            plain = url.replace("postgresql+psycopg://", "postgresql://")
            ask = psycopg.connect(plain, autocommit=True)
        async with create_engine(settings, W.registry()) as engine, engine.worker():
            for side in "AB" * 2:  # (warm-up: statements prepared, both sides' code run)
                use(side)
                await _batch(engine, max(per, 5), [])
            for b in range(batches):
                for side in "AB" if b % 2 == 0 else "BA":
                    use(side)
                    cpu, lat, server = out[side]
                    on_server = server if ask is not None else None
                    cpu.append(await _batch(engine, per, lat, on_server, ask))
            use("B")
        if ask is not None:
            ask.close()
    return out


def report(
    out: dict[str, tuple[list[float], list[float], list[float]]], say: Callable[[str], None]
) -> None:
    for side in "AB":
        cpu, lat, server = out[side]
        on_server = (
            f", server CPU a run mean {1e3 * statistics.mean(server):.3f} ms" if server else ""
        )
        say(
            f"{side}: {len(lat)} runs, CPU a run mean {1e3 * statistics.mean(cpu):.3f} ms, "
            f"median {1e3 * statistics.median(cpu):.3f} ms, "
            f"p50 {1e3 * statistics.median(lat):.3f} ms{on_server}"
        )
    (a_cpu, a_lat, a_server), (b_cpu, b_lat, b_server) = out["A"], out["B"]
    pairs = [b / a for a, b in zip(a_cpu, b_cpu, strict=True)]
    on_server = ""
    if a_server and b_server:
        server_pairs = [b / a for a, b in zip(a_server, b_server, strict=True) if a]
        on_server = (
            f", server CPU a run {statistics.mean(b_server) / statistics.mean(a_server):.3f} "
            f"(per-pair median {statistics.median(server_pairs):.3f})"
        )
    say(
        f"B/A: CPU a run {statistics.mean(b_cpu) / statistics.mean(a_cpu):.3f}, "
        f"p50 {statistics.median(b_lat) / statistics.median(a_lat):.3f}, "
        f"per-pair CPU median {statistics.median(pairs):.3f}{on_server}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("backend", nargs="?", default="postgres", choices=["sqlite", "postgres"])
    ap.add_argument("--swap", action="append", required=True, metavar="FILE:NAME")
    ap.add_argument("--base", default="HEAD")
    ap.add_argument("--aa", action="store_true")
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--per", type=int, default=20)
    args = ap.parse_args()
    swaps = [Swap(s, args.base) for s in args.swap]
    out = asyncio.run(measure(args.backend, swaps, args.batches, args.per, args.aa))
    print(f"{args.backend}: {' '.join(args.swap)} at {args.base} (A) / working tree (B)")
    report(out, print)


if __name__ == "__main__":
    main()
