"""A driver from another package plugs in through its entry point and proves itself with the
conformance README's recipe, under pytest-asyncio's strict mode and auto mode.

The package is built in a temporary folder: a module with a factory that delegates to the
native driver through the port (``create_engine``), and a ``.dist-info`` declaring the
``wfe.drivers`` entry point, both put on PYTHONPATH as an installed package would be. A pytest
subprocess, started in that folder (no project configuration applies), runs ``AllContracts``
against it; the crash scenario's worker subprocess builds the driver through the same entry
point. A selection of scenarios runs here (WFE_THIRD_PARTY_ALL=1 runs every one).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.entry_points import write_dist_info

ROOT = Path(__file__).resolve().parents[2]

DRIVER = '''
"""acme_wfe: the native driver under another name, installed through an entry point."""
from engine_port import create_engine


def create(settings, registry, **ports):
    return create_engine(settings.model_copy(update={"driver": "native"}), registry, **ports)
'''

# conformance/README.md, "Opting a driver in", with the driver's settings filled in
RECIPE = """
import pytest
from conformance import AllContracts, Capabilities, SettingsHarness
from engine_port import EngineSettings

class TestMyDriver(AllContracts):
    @pytest.fixture
    def harness(self, tmp_path):
        return SettingsHarness(EngineSettings(driver="acme",
                                              database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
                                              blob_url=f"file://{tmp_path / 'blobs'}",
                                              lease_seconds=1.0),
                               capabilities=Capabilities())
"""

# strict mode: flow, the crash worker subprocess, blob_store= and a settings override, bad
# input; auto mode: two quick ones (the marks are what differs, not the scenarios)
SELECTION = {
    "strict": "s1_ or s17 or s14_claim or spill_threshold or s16_bad",
    "auto": "s1_ or s16_bad",
}


@pytest.fixture
def package(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    src, site, suite = tmp_path / "src", tmp_path / "site", tmp_path / "suite"
    (src / "acme_wfe").mkdir(parents=True)
    (src / "acme_wfe" / "__init__.py").write_text(DRIVER)
    write_dist_info(site, "acme-wfe", {"acme": "acme_wfe:create"})
    suite.mkdir()
    (suite / "test_acme.py").write_text(textwrap.dedent(RECIPE))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WFE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(src), str(site), str(ROOT)])
    env.pop("PYTEST_ADDOPTS", None)
    return suite, env


@pytest.mark.parametrize("mode", ["strict", "auto"])
def test_all_contracts_pass_on_a_driver_from_another_package(
    package: tuple[Path, dict[str, str]], mode: str
) -> None:
    suite, env = package
    select = [] if os.environ.get("WFE_THIRD_PARTY_ALL") else ["-k", SELECTION[mode]]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            f"asyncio_mode={mode}",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            *select,
            "test_acme.py",
        ],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    tail = out.stdout[-4000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    summary = out.stdout.strip().splitlines()[-1]
    passed = int(re.search(r"(\d+) passed", summary).group(1))  # type: ignore[union-attr]
    assert passed >= (5 if mode == "strict" else 2), tail
    assert not re.search(r"failed|error|skipped|warnings?", summary), tail
