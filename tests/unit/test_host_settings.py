"""The host settings of issue 16: seed defaults, validation, and what they change."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

from engine_port import EngineSettings, Registry, StageContext, StageRunner, Workflow
from wfe_cli import app


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("WFE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_defaults_follow_the_seed_where_the_project_does_not_differ() -> None:
    s = EngineSettings()
    assert s.job_absolute_timeout == 3600.0
    assert (s.max_claims_per_tick, s.max_suspended_checks_per_tick) == (10, 10)
    assert s.max_outbox_flush_per_tick == 100
    assert s.serves is None and s.retention is None
    # the deliberate differences (README "Hosts"): the 30 s lease, beats every 0.5 s
    assert (s.lease_threshold, s.heartbeat_interval) == (30.0, 0.5)
    seed = EngineSettings(stale_lease_threshold=300, job_heartbeat_interval=60)
    assert (seed.lease_threshold, seed.heartbeat_interval) == (300.0, 60.0)


def test_environment_sets_host_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WFE_RETENTION", "86400")
    monkeypatch.setenv("WFE_SERVES", "all")
    monkeypatch.setenv("WFE_JOB_ABSOLUTE_TIMEOUT", "0")
    s = EngineSettings()
    assert (s.retention, s.serves, s.job_absolute_timeout) == (86400.0, "all", 0.0)


def test_a_heartbeat_slower_than_the_lease_is_refused() -> None:
    with pytest.raises(ValidationError, match="job_heartbeat_interval"):
        EngineSettings(job_heartbeat_interval=60)  # against the 30 s lease
    with pytest.raises(ValidationError):
        EngineSettings(serves="some")  # type: ignore[arg-type]


class In(BaseModel):
    n: int = 0


def _stage_timeout(**settings: float) -> float | None:
    wf = Workflow("capped", input=In)

    @wf.stage(timeout=timedelta(hours=2))
    async def long(ctx: StageContext[In]) -> int:
        return 1

    runner = StageRunner.for_settings(Registry([wf]), None, EngineSettings(**settings))
    return runner.timeout_of(wf.get_stage("long"))


def test_job_absolute_timeout_caps_every_attempt_and_zero_disables() -> None:
    assert _stage_timeout() == 3600.0  # the stage asks for 2 h: the 1 h cap wins
    assert _stage_timeout(job_absolute_timeout=0) == 7200.0
    assert _stage_timeout(job_absolute_timeout=10_000) == 7200.0


def test_worker_options_are_validated_before_anything_starts() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["worker", "--app", "x:y", "--retention", "soon"])
    assert bad.exit_code != 0 and "duration" in bad.output
    bad = runner.invoke(app, ["worker", "--app", "x:y", "--serves", "some"])
    assert bad.exit_code != 0 and "serves" in bad.output
    bad = runner.invoke(app, ["worker", "--app", "x:y", "--job-heartbeat-interval", "1m"])
    assert bad.exit_code != 0 and "job_heartbeat_interval" in bad.output
