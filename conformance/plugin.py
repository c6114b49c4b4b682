"""The conformance suite's pytest plugin (registered through the ``pytest11`` entry point).

It registers the suite's markers; the scenarios themselves are the ``*Contract`` classes in
:mod:`conformance`, which a driver opts into with one test class (see conformance/README.md).
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: a scenario of the driver contract")
