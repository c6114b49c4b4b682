"""Ctrl-C at any moment of a ``wfe`` command exits 130 with one line, never a traceback: also
in its first ~0.4 s, while Python imports the command line (a KeyboardInterrupt raised inside
an import printed its traceback)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wfe_cli import EXIT_CODES

ENTRY_POINTS = {
    "console-script": [str(Path(sys.executable).with_name("wfe"))],
    "python-m": [sys.executable, "-m", "wfe_cli"],
}


def _catches_sigint(pid: int) -> bool:
    """Whether the process has a SIGINT handler yet (the interpreter installs its own early in
    its start-up, before it imports ``site``; wfe's is installed a few milliseconds later)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True  # (no /proc: rely on the delay alone)
    caught = next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGINT - 1)))


# a frame of a traceback: its file and function
_FRAME = re.compile(r'File "([^"]+)", line \d+, in (\S+)')
# what the console script (or ``python -m wfe_cli``) runs before wfe's ``main`` takes Ctrl-C
# over: the package's and the entry module's own lines (and what they import from the standard
# library); a frame of another wfe_cli module, of the port or of a library is wfe's import
_BEFORE_MAIN = ("__init__.py", "_entry.py", "__main__.py")
_LOADED_BY_WFE = ("engine_port", "typer", "click", "pydantic", "rich")


def _python_starting(returncode: int, err: str) -> bool:
    """Whether SIGINT reached the interpreter before wfe's ``main`` ran (the interpreter's own
    start-up, ``site``, the first import of ``wfe_cli``): a KeyboardInterrupt there is
    Python's, which no package can prevent; the test then tries that moment again."""
    if not ("Traceback" in err or "Exception ignored" in err or returncode == -signal.SIGINT):
        return False
    for path, function in _FRAME.findall(err):
        parts = Path(path).parts
        if "wfe_cli" in parts and (function == "main" or parts[-1] not in _BEFORE_MAIN):
            return False
        if any(name in parts for name in _LOADED_BY_WFE):
            return False
    return True


def _interrupted(command: list[str], delay: float, cwd: Path) -> tuple[int, str, str]:
    """Start ``command``, send it SIGINT ``delay`` seconds after the interpreter can take one,
    and return its exit code, stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WFE_")}
    # started as from a terminal: a test run started in the background by a script (CI's
    # `.ci/run &`) has SIGINT ignored, which a child inherits across exec (a handler is not
    # inherited), and a command started with SIGINT ignored rightly keeps ignoring it (the
    # test below)
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=env,
        )
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        # a loaded machine can take long to reach the interpreter's own handler; before it,
        # SIGINT kills any Python process (no code of wfe has run)
        deadline = time.monotonic() + 30
        while not _catches_sigint(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.parametrize("delay", [0.05, 0.1, 0.2, 0.3, 1.0])
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_ctrl_c_while_the_command_line_loads_exits_130_in_one_line(
    entry: str, delay: float, tmp_path: Path
) -> None:
    """SIGINT ``delay`` seconds after the interpreter can take one: during the imports for the
    early delays, during the command (reading its payload from stdin, so it never ends on
    its own) for the late ones; each exits 130 with one line. (On a loaded machine the
    interpreter may still be starting at the early moments: that try is made again.)"""
    if not Path(ENTRY_POINTS[entry][0]).exists():
        pytest.skip("the wfe console script is not installed next to this interpreter")
    command = [*ENTRY_POINTS[entry], "start", "some-workflow", "-"]
    for _ in range(10):
        returncode, out, err = _interrupted(command, delay, tmp_path)
        if not _python_starting(returncode, err):
            break
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert returncode == EXIT_CODES["interrupted"], (returncode, err)
    assert err.strip() == "error: interrupted" and out == ""
    assert list(tmp_path.iterdir()) == []


def test_a_command_started_with_sigint_ignored_keeps_ignoring_it(tmp_path: Path) -> None:
    """A shell starts a background command with SIGINT ignored: wfe must not take it over."""
    command = [*ENTRY_POINTS["python-m"], "start", "some-workflow", "-"]
    proc = subprocess.Popen(
        ["/bin/sh", "-c", 'trap "" INT; exec "$@"', "sh", *command],  # (ignored across exec)
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        for _ in range(4):
            time.sleep(0.15)
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(input="", timeout=60)  # (then it reads an empty payload)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_CODES["bad_input"], (proc.returncode, err)
    assert "payload read from stdin is empty" in err and "Traceback" not in err


def test_a_sigint_while_python_starts_is_told_from_one_during_wfe_imports() -> None:
    """The test above tries again only where wfe's code had not run yet."""
    site = (
        "Traceback (most recent call last):\n"
        '  File "/venv/bin/wfe", line 3, in <module>\n'
        '  File "/src/wfe_cli/__init__.py", line 12, in <module>\n'
        '  File "/src/wfe_cli/_entry.py", line 14, in <module>\n'
        '  File "/usr/lib/python3.11/signal.py", line 3, in <module>\n'
        "KeyboardInterrupt\n"
    )
    assert _python_starting(-signal.SIGINT, site)
    assert _python_starting(1, site.replace("Traceback (most", "Exception ignored in: x\n(most"))
    in_main = site.replace('_entry.py", line 14, in <module>', '_entry.py", line 40, in main')
    assert not _python_starting(-signal.SIGINT, in_main)
    in_cli = site.replace("_entry.py", "_main.py")
    assert not _python_starting(-signal.SIGINT, in_cli)
    in_typer = site.replace("/usr/lib/python3.11/signal.py", "/venv/site-packages/typer/main.py")
    assert not _python_starting(-signal.SIGINT, in_typer)
    assert not _python_starting(130, "error: interrupted\n")


def test_importing_wfe_cli_for_its_entry_point_loads_nothing_slow() -> None:
    """The console script imports ``wfe_cli`` before it calls ``main`` (which takes Ctrl-C
    over): that import loads only a few standard modules, not the command line (typer,
    pydantic, the port)."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "from wfe_cli import main\n"
        "loaded = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(' '.join(sorted(loaded - set(sys.stdlib_module_names) - {'wfe_cli'})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == []
