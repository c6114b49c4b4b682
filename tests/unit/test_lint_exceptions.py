"""The long-function rules stay on, and every exception to them says why (issue 17).

ruff's too-many-statements (PLR0915) and too-many-branches (PLR0912) are on; a function that
stays over them carries a noqa comment naming the rule, then the reason, on its ``def`` line
(README "Tests"). A bare noqa, one on a line that is not a ``def``, or one for the whole file
would hide the next long function without a word, so this test refuses them (ruff's RUF100
already refuses unused ones).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULES = ("PLR0912", "PLR0915")
_NOQA = re.compile(r"#\s*noqa\b(?P<codes>:?[^#]*)", re.IGNORECASE)
_CODES = re.compile(r":\s*(?P<list>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)(?P<why>.*)")


def _sources() -> list[Path]:
    skip = {".venv", ".git", "node_modules", "build", "dist"}
    return [
        p
        for p in sorted(ROOT.rglob("*.py"))
        if not skip.intersection(p.relative_to(ROOT).parts)
        and not any(part.endswith(".egg-info") for part in p.parts)
    ]


def exceptions_without_a_reason(path: Path, text: str) -> list[str]:
    """The lines of ``text`` that turn PLR0912/PLR0915 off without saying why, or anywhere
    but on a ``def`` line."""
    bad = []
    for number, line in enumerate(text.splitlines(), 1):
        if re.search(r"ruff\s*:\s*noqa", line, re.IGNORECASE) and any(r in line for r in RULES):
            bad.append(f"{path}:{number}: a file-wide exception; put it on the def line")
            continue
        found = _NOQA.search(line)
        if found is None:
            continue
        codes = _CODES.match(found.group("codes"))
        if codes is None:
            if found.group("codes").strip() == "" and line.lstrip().startswith(("def ", "async ")):
                bad.append(f"{path}:{number}: a bare noqa on a def line hides PLR0912/PLR0915")
            continue
        named = {c.strip() for c in codes.group("list").split(",")}
        if not named.intersection(RULES):
            continue
        if not line.lstrip().startswith(("def ", "async def ")):
            bad.append(f"{path}:{number}: {sorted(named)} belongs on the function's def line")
        elif len(codes.group("why").strip(" -:()")) < 10:
            bad.append(f"{path}:{number}: say why the function stays long after the codes")
    return bad


def test_the_long_function_rules_are_on() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    lint = config["tool"]["ruff"]["lint"]
    assert "PL" in lint["select"]
    for rule in RULES:
        assert rule not in lint.get("ignore", []), f"{rule} is ignored again in pyproject.toml"
        for path, ignored in lint.get("per-file-ignores", {}).items():
            assert rule not in ignored, f"{rule} is off for {path}: use a per-function noqa"


def test_every_exception_says_why() -> None:
    bad = [
        problem
        for path in _sources()
        for problem in exceptions_without_a_reason(
            path.relative_to(ROOT), path.read_text(encoding="utf-8")
        )
    ]
    assert bad == []


def test_the_check_refuses_what_it_should() -> None:
    noqa = "# noqa"  # split so that this file's own scan does not read these samples
    sample = (
        f"def a():  {noqa}: PLR0915\n"
        f"def b():  {noqa}: PLR0912, PLR0915  one scenario read top to bottom\n"
        f"async def c():  {noqa}\n"
        f"    x = 1  {noqa}: PLR0915  not a def line at all, though\n"
        f"# ruff: {noqa[2:]}: PLR0912\n"
        f"def d():  {noqa}: E501\n"
    )
    reasons = exceptions_without_a_reason(Path("x.py"), sample)
    assert [r.split(":")[1] for r in reasons] == ["1", "3", "4", "5"]
