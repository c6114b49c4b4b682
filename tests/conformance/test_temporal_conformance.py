"""The conformance contract on the Temporal driver, against a real dev server."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from conformance import AllContracts, SettingsHarness
from engine_port import EngineSettings


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
        return SettingsHarness(settings, name="temporal")
