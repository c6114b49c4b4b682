"""The conformance suite's pytest plugin (registered through the ``pytest11`` entry point).

It registers the suite's markers and marks the suite's modules for pytest's assertion
rewriting (a failing ``assert`` in a scenario then says what differed, as in a test module);
the scenarios themselves are the ``*Contract`` classes in :mod:`conformance`, which a driver
opts into with one test class (see conformance/README.md).
"""

from __future__ import annotations

import pkgutil
import sys
from pathlib import Path

import pytest

__all__ = ["rewrite_asserts"]


def rewrite_asserts() -> None:
    """Mark the suite's modules not imported yet for assertion rewriting by the running pytest
    session (nothing outside one). :mod:`conformance` imports them when a name is first used,
    so they are still to come when a session loads this plugin or configures itself."""
    package = Path(__file__).parent
    names = [f"{__package__}.{m.name}" for m in pkgutil.iter_modules([str(package)])]
    fresh = [name for name in names if name not in sys.modules]
    if fresh:
        pytest.register_assert_rewrite(*fresh)


rewrite_asserts()  # on loading the entry point: before conftest files import the suite


def pytest_configure(config: pytest.Config) -> None:
    rewrite_asserts()  # a later session in the same process (``wfe conformance`` in a test)
    config.addinivalue_line("markers", "conformance: a scenario of the driver contract")
