"""Run the mutant catalogue against the conformance suite.

    python -m tests.mutation [--only ID[,ID...]] [--targets native-sqlite,temporal]
                             [--timeout SECONDS] [--out report.md] [--json report.json]

For each mutant, in turn: copy the tree (tracked and untracked-but-not-ignored files of the
caller's checkout, as they are on disk) into a temporary folder, check the mutant's snippet
occurs there exactly once (else the mutant is STALE), apply it, and run that target's contract
tests against the copy (``PYTHONPATH`` = the copy, the caller's Python, ``-x``, ``CI=true`` so a
missing golden file fails instead of being written). The caller's checkout is never changed.

Verdicts: killed (a contract test failed), survived, stale, timeout (counts as killed: the
unmutated tree passed the same selection within the same limit first), error (pytest could not
run, e.g. a collection error: not counted as killed). The unmutated tree is run first for each
target; if it fails, that target's mutants are not judged.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .catalogue import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]

# target -> (test files that must exist, optional files, -k selection)
TARGETS: dict[str, tuple[list[str], list[str], str]] = {
    "native-sqlite": (
        ["tests/conformance/test_native_conformance.py"],
        ["tests/conformance/test_fuzz.py"],
        "sqlite",
    ),
    "temporal": (
        ["tests/conformance/test_temporal_conformance.py"],
        ["tests/conformance/test_fuzz.py"],
        "temporal",
    ),
}
DEFAULT_TIMEOUT = {"native-sqlite": 300.0, "temporal": 900.0}


@dataclass
class Verdict:
    mutant: Mutant | None
    target: str
    status: str  # killed | survived | stale | timeout | error | passed | failed
    seconds: float
    detail: str = ""


def _copy_tree(dest: Path) -> None:
    """The caller's checkout as it is on disk (tracked + untracked, not ignored files)."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    for rel in sorted({p for p in out.decode().split("\0") if p}):
        src = ROOT / rel
        if not src.is_file():
            continue  # deleted in the work tree
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def _selection(tree: Path, target: str) -> list[str]:
    required, optional, _ = TARGETS[target]
    return required + [f for f in optional if (tree / f).exists()]


def _pytest(tree: Path, target: str, k: str, limit: float) -> tuple[str, float, str]:
    """Run pytest in ``tree``; returns (passed | failed | timeout | error, seconds, detail)."""
    env = {k2: v for k2, v in os.environ.items() if k2 not in ("WFE_UPDATE_GOLDEN",)}
    env.update(PYTHONPATH=str(tree), CI="true", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", *_selection(tree, target)]
    cmd += ["-k", k, "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=--strict-markers"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: a timeout kills the dev server too
    )
    try:
        raw, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", time.monotonic() - t0, f"no verdict within {limit:g}s"
    finally:
        if proc.poll() is None:  # interrupted: leave nothing behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    seconds = time.monotonic() - t0
    text = raw.decode(errors="replace")
    if proc.returncode == 0:
        return "passed", seconds, ""
    if proc.returncode == 5:
        return "empty", seconds, "no tests selected"
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)
    if proc.returncode == 1 and failed:
        return "failed", seconds, failed[0].split("::")[-1]
    tail = " | ".join(text.strip().splitlines()[-3:])
    return "error", seconds, f"pytest exit {proc.returncode}: {tail[-300:]}"


def _judge(m: Mutant, pristine: Path, work: Path, limit: float, keep: bool) -> Verdict:
    tree = work / m.id
    shutil.copytree(pristine, tree)
    try:
        path = tree / m.file
        text = path.read_text() if path.exists() else ""
        n = text.count(m.original)
        if n != 1:
            return Verdict(m, m.target, "stale", 0.0, f"snippet occurs {n} times in {m.file}")
        path.write_text(text.replace(m.original, m.replacement))
        k = TARGETS[m.target][2]
        spent = 0.0
        if m.focus:
            status, secs, detail = _pytest(tree, m.target, f"{k} and ({m.focus})", limit)
            spent += secs
            if status == "failed":
                return Verdict(m, m.target, "killed", spent, detail)
            if status == "timeout":
                return Verdict(m, m.target, "timeout", spent, detail)
            if status == "error":
                return Verdict(m, m.target, "error", spent, detail)
        status, secs, detail = _pytest(tree, m.target, k, max(1.0, limit - spent))
        spent += secs
        verdict = {"failed": "killed", "passed": "survived", "timeout": "timeout"}.get(
            status, "error"
        )
        return Verdict(m, m.target, verdict, spent, detail)
    finally:
        if not keep:
            shutil.rmtree(tree, ignore_errors=True)


def _table(verdicts: list[Verdict]) -> str:
    judged = [v for v in verdicts if v.mutant is not None and v.status != "stale"]
    killed = [v for v in judged if v.status in ("killed", "timeout")]
    lines = ["| mutant | driver | target | verdict | s | failing test / note | rule broken |"]
    lines.append("|---|---|---|---|---|---|---|")
    for v in verdicts:
        m = v.mutant
        name, driver, rule = ("(unmutated tree)", "-", "-")
        if m is not None:
            name, driver, rule = m.id, m.driver, m.rule
        lines.append(
            f"| {name} | {driver} | {v.target} | {v.status} | {v.seconds:.0f} | "
            f"{v.detail.replace('|', '/')} | {rule} |"
        )
    stale = sum(1 for v in verdicts if v.status == "stale")
    rate = 100.0 * len(killed) / len(judged) if judged else 0.0
    lines.append("")
    lines.append(
        f"killed {len(killed)} of {len(judged)} judged mutants ({rate:.1f}%); "
        f"stale {stale}; survived {sum(1 for v in judged if v.status == 'survived')}; "
        f"errors {sum(1 for v in judged if v.status == 'error')}"
    )
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    doc = (__doc__ or "").strip().splitlines()
    ap = argparse.ArgumentParser(prog="python -m tests.mutation", description=doc[0] if doc else "")
    ap.add_argument("--only", help="comma-separated mutant ids (or id prefixes)")
    ap.add_argument("--targets", default="native-sqlite,temporal")
    ap.add_argument("--timeout", type=float, help="seconds per mutant (default per target)")
    ap.add_argument("--out", help="write the table (markdown) here")
    ap.add_argument("--json", help="write the verdicts (JSON) here")
    ap.add_argument("--keep", action="store_true", help="keep the mutated copies")
    ap.add_argument("--list", action="store_true", help="list the catalogue and exit")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        ap.error(f"unknown target(s) {unknown}; choose from {sorted(TARGETS)}")
    chosen = [m for m in MUTANTS if m.target in targets]
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        chosen = [m for m in chosen if any(m.id == w or m.id.startswith(w) for w in wanted)]
    if args.list:
        for m in chosen:
            print(f"{m.id:45} {m.driver:8} {m.file:32} {m.rule}")
        return 0
    if not chosen:
        ap.error("no mutant matches --only/--targets")

    with tempfile.TemporaryDirectory(prefix="wfe-mutants-") as tmp:
        work = Path(tmp)
        verdicts = _judge_all(chosen, targets, args, work)
        if args.keep:
            kept = ROOT.parent / f"{ROOT.name}-mutants"
            shutil.copytree(work, kept, dirs_exist_ok=True)
            print(f"mutated copies kept in {kept}")
    table = _table(verdicts)
    print(table)
    if args.out:
        Path(args.out).write_text(table)
    if args.json:
        Path(args.json).write_text(json.dumps(_rows(verdicts), indent=1) + "\n")
    judged = [v for v in verdicts if v.mutant is not None and v.status != "stale"]
    return 0 if judged and all(v.status in ("killed", "timeout") for v in judged) else 1


def _judge_all(
    chosen: list[Mutant], targets: list[str], args: argparse.Namespace, work: Path
) -> list[Verdict]:
    """Each target's baseline (the unmutated tree must pass), then its mutants, one at a time:
    native (and port) mutants first, Temporal after."""
    verdicts: list[Verdict] = []
    pristine = work / "_pristine"
    _copy_tree(pristine)
    for target in [t for t in TARGETS if t in targets]:
        todo = [m for m in chosen if m.target == target]
        if not todo:
            continue
        limit = args.timeout or DEFAULT_TIMEOUT[target]
        if not args.no_baseline:
            status, secs, detail = _pytest(pristine, target, TARGETS[target][2], limit)
            verdicts.append(Verdict(None, target, status, secs, detail))
            print(f"[baseline {target}] {status} in {secs:.0f}s {detail}", flush=True)
            if status != "passed":
                print(f"unmutated tree does not pass on {target}: its mutants are not judged")
                continue
        for m in todo:
            v = _judge(m, pristine, work, limit, args.keep)
            verdicts.append(v)
            print(f"[{m.id}] {v.status} in {v.seconds:.0f}s {v.detail}", flush=True)
    return verdicts


def _rows(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    return [
        {
            "id": None if v.mutant is None else v.mutant.id,
            "driver": None if v.mutant is None else v.mutant.driver,
            "file": None if v.mutant is None else v.mutant.file,
            "rule": None if v.mutant is None else v.mutant.rule,
            "target": v.target,
            "verdict": v.status,
            "seconds": round(v.seconds, 1),
            "detail": v.detail,
        }
        for v in verdicts
    ]


if __name__ == "__main__":
    sys.exit(main())
