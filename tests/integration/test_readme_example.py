"""The README's first example runs as written (it had a top-level ``async with`` and an
undefined ``charge_card``): extracted from README.md and run in a fresh interpreter on the
embedded default, in a folder of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _first_example() -> str:
    text = README.read_text()
    start = text.index("```python", text.index("## A workflow")) + len("```python")
    return text[start : text.index("```", start)]


def test_the_readme_workflow_example_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(_first_example())
    env = {k: v for k, v in os.environ.items() if not k.startswith("WFE_")}
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "completed txn-9.5", result.stdout
