"""A Temporal address written as a URL (``http://127.0.0.1:7233``, as the Web UI's address
is) is refused in one line naming the HOST:PORT to write, before anything connects: temporalio
took it with a UserWarning printed to the user ("will be an error in future versions"), and
the engine's "auto" compression did not see the loopback host in it."""

from __future__ import annotations

import re
import warnings

import pytest

from driver_temporal import TemporalEngine
from engine_port import EngineSettings, Registry
from engine_port.errors import ConfigurationError


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_an_address_with_a_scheme_is_a_configuration_error(scheme: str) -> None:
    engine = TemporalEngine(
        EngineSettings(driver="temporal", temporal_address=f"{scheme}://127.0.0.1:1/"),
        Registry([]),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (temporalio's UserWarning would fail the test)
        with pytest.raises(ConfigurationError, match=re.escape("set it to '127.0.0.1:1'")):
            await engine.connect()
    await engine.close()
