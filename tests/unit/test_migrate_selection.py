"""``migrate_runs`` checks what it selects by before anything moves."""

from __future__ import annotations

import pytest

from engine_port import EngineSettings, Registry, RunStatus, create_engine, migrate_runs
from engine_port.errors import InvalidInputError


@pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED, "cancelled"])
async def test_a_status_runs_never_move_in_is_refused(status: str) -> None:
    """``wfe migrate --status completed`` selected nothing and reported "moved: 0", as if the
    database had no such run."""
    source = create_engine(EngineSettings(driver="memory"), Registry())
    target = create_engine(EngineSettings(driver="memory"), Registry())
    async with source, target:
        with pytest.raises(InvalidInputError, match=r"never move.*select among pending"):
            await migrate_runs(source, target, statuses=[status])  # type: ignore[list-item]
        report = await migrate_runs(source, target, statuses=[RunStatus.SUSPENDED])
    assert report.moves == []
