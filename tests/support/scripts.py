"""Client scripts the tests run in a child process of their own (what a process does at exit,
what the SDK core writes to the stderr it found), with this checkout importable."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]


async def start_script(
    script: Path, *args: str, stdout: int = asyncio.subprocess.DEVNULL
) -> asyncio.subprocess.Process:
    """``python script args...``, its stderr piped (``stdout``: DEVNULL unless asked)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return await asyncio.create_subprocess_exec(
        sys.executable, str(script), *args, stdout=stdout, stderr=asyncio.subprocess.PIPE, env=env
    )
