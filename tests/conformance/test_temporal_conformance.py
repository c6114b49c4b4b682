"""The conformance contract on the Temporal driver, against a real dev server."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from conformance import AllContracts, SettingsHarness
from engine_port import EngineSettings

# seconds without a heartbeat before Temporal retries the stage activity of a worker that
# went away mid-stage (a worker context left while its stage ran): the driver's default of
# 10 s made such scenarios wait 10 s. 5 s keeps a margin for the ``wfe worker``
# subprocesses of the crash scenarios, which beat at their own default pace (every 2.5 s).
TEMPORAL_OPTIONS = {"heartbeat_timeout": 5.0}


@pytest.mark.temporal
class TestTemporal(AllContracts):
    @pytest.fixture
    def harness(self, temporal_server: Any, tmp_path: Path) -> SettingsHarness:
        settings = EngineSettings(
            driver="temporal",
            temporal_address=temporal_server.address,
            task_queue=f"c-{uuid.uuid4().hex[:10]}",
            blob_url=f"file://{tmp_path / 'blobs'}",
        )
        return SettingsHarness(settings, options=TEMPORAL_OPTIONS, name="temporal")
