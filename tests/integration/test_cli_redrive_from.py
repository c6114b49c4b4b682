"""``wfe redrive RUN --from X`` on the native SQLite driver: an X that is no stage of the run
is bad input (exit 7) and says what to give instead; a redrive from the last failure of a run
that has none is a wrong state (exit 4). No message names the Python parameter ``from_=``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner

from engine_port import create_engine, load_settings
from engine_port.errors import InvalidInputError, InvalidRedriveError, UnknownRedriveStageError
from wfe_cli import EXIT_CODES, app
from wfe_cli._apps import load_registry

from .test_cli import APP_MODULE

# the CLI tests' app (workflow ``cli-flaky``: ``first``, then ``second``, which fails on demand)


async def _finished_runs(payloads: list[dict[str, object]]) -> list[str]:
    registry = load_registry("redriveapp")
    async with create_engine(load_settings(), registry) as engine, engine.worker():
        ids = [(await engine.start("cli-flaky", p)).id for p in payloads]
        for run_id in ids:
            await engine.wait(run_id, timeout=30)
    return ids


def test_redrive_from_an_unknown_stage_is_bad_input_naming_the_choices(
    env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "redriveapp.py").write_text(APP_MODULE)
    ok, bad = asyncio.run(_finished_runs([{}, {"fail": True}]))
    runner = CliRunner()

    unknown = runner.invoke(app, ["redrive", bad, "--from", "nosuchstage"])
    assert unknown.exit_code == EXIT_CODES["bad_input"], unknown.output
    assert unknown.stdout == ""
    assert (
        f"cannot redrive run {bad!r} from 'nosuchstage': no such stage; use 'last_failure', "
        "'start' or one of its stages ['first', 'second']"
    ) in unknown.stderr
    assert "from_" not in unknown.stderr

    nothing_failed = runner.invoke(app, ["redrive", ok])  # from the last failure: none
    assert nothing_failed.exit_code == EXIT_CODES["wrong_state"], nothing_failed.output
    assert "has no failed stage" in nothing_failed.stderr
    assert "from 'start'" in nothing_failed.stderr
    assert "from_" not in nothing_failed.stderr

    # the runs are as they were: a redrive from a real stage still works
    fine = runner.invoke(app, ["redrive", bad, "--from", "second"])
    assert fine.exit_code == 0, fine.output


def test_the_unknown_stage_error_is_bad_input_and_still_an_invalid_redrive() -> None:
    exc = UnknownRedriveStageError("r1", "nope", ["a", "b"])
    assert isinstance(exc, InvalidRedriveError) and isinstance(exc, InvalidInputError)
    assert str(exc) == (
        "cannot redrive run 'r1' from 'nope': no such stage; use 'last_failure', 'start' or "
        "one of its stages ['a', 'b']"
    )
