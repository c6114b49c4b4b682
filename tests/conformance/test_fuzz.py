"""The differential fuzzer: generated cases on each driver, compared with the reference model
(conformance/_model.py). Deterministic in CI (derandomized, no example database).

Each hypothesis example is a batch of cases run on ONE fresh engine + worker; a failing batch
is shrunk by hypothesis (each shrink step on a fresh engine) towards the smallest failing case,
and the failure lists every divergent case as ready-to-paste code. Knobs (``./dev fuzz``):
WFE_FUZZ_CASES (per target; default 100 on native, 50 on Temporal, where each generated workflow
registers a Worker Deployment and a batch costs several times a native one),
WFE_FUZZ_SEED (default: derandomized),
WFE_FUZZ_GAPS=none (also draw the known gaps, conformance._cases.KNOWN_GAPS),
WFE_FUZZ_SHRINK=0 (report the first failing batch without shrinking).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from conformance import SettingsHarness
from conformance._cases import KNOWN_GAPS, Case, cases
from conformance._fuzz import check_batch, run_batch
from engine_port import EngineSettings

BATCH = 25
# pytest-timeout: generous for CI's 100 cases, and growing with a long run's WFE_FUZZ_CASES
TIMEOUT = max(900, 6 * int(os.environ.get("WFE_FUZZ_CASES", "100")))


def _knobs(default_cases: int) -> tuple[int, int | None, frozenset[str], bool]:
    n = int(os.environ.get("WFE_FUZZ_CASES", str(default_cases)))
    raw_seed = os.environ.get("WFE_FUZZ_SEED")
    gaps = frozenset() if os.environ.get("WFE_FUZZ_GAPS") == "none" else KNOWN_GAPS
    shrink = os.environ.get("WFE_FUZZ_SHRINK", "1") != "0"
    return n, None if raw_seed is None else int(raw_seed), gaps, shrink


def fuzz(
    make_harness: Callable[[], tuple[SettingsHarness, dict[str, Any]]],
    target: str,
    default_cases: int = 100,
) -> None:
    n, fixed_seed, gaps, shrink = _knobs(default_cases)
    batches = max(1, -(-n // BATCH))
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])

    @settings(
        # the first example hypothesis tries is the all-minimal one: one more batch for it
        max_examples=batches + 1,
        derandomize=fixed_seed is None,
        database=None,
        deadline=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(cases(gaps), min_size=BATCH, max_size=BATCH))
    def run(batch: list[Case]) -> None:
        harness, extra = make_harness()
        results = asyncio.run(run_batch(harness, batch, **extra))
        check_batch(results, target)

    if fixed_seed is not None:
        run = seed(fixed_seed)(run)
    run()


def _native(
    url: Callable[[], str], tmp: pytest.TempPathFactory
) -> Callable[[], tuple[SettingsHarness, dict[str, Any]]]:
    def make() -> tuple[SettingsHarness, dict[str, Any]]:
        blobs = tmp.mktemp("fuzz-blobs")
        settings = EngineSettings(
            driver="native",
            database_url=url() if url is not None else "",
            blob_url=f"file://{blobs}",
            # no crashes are drawn: a long lease keeps a starved heartbeat on a busy machine
            # from looking like one (a takeover replays a stage and changes its trace)
            lease_seconds=15.0,
            worker_concurrency=128,
        )
        return SettingsHarness(settings, name="native"), {}

    return make


pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")


@pytest.mark.timeout(TIMEOUT)
def test_fuzz_native_sqlite(tmp_path_factory: pytest.TempPathFactory) -> None:
    def url() -> str:
        return f"sqlite:///{tmp_path_factory.mktemp('fuzz-db') / 'wfe.db'}"

    fuzz(_native(url, tmp_path_factory), "native-sqlite")


@pytest.mark.postgres
@pytest.mark.timeout(TIMEOUT)
def test_fuzz_native_postgres(pg_session: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    fuzz(_native(pg_session.new_schema, tmp_path_factory), "native-postgres")


@pytest.fixture(scope="module")
def fuzz_temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A dev server of its own: every generated workflow registers its own Worker Deployment
    (one per workflow id), and the dev server allows 100 per namespace and rate-limits the
    deployment read API; past that a start fails with DriverUnavailableError. A separate
    server with raised limits keeps the fuzzer from exhausting the session's shared one."""
    from tests.support.temporal import roomy_dev_server

    log = tmp_path_factory.mktemp("temporal-fuzz") / "dev-server.log"
    server = roomy_dev_server(headless=True, log_file=log)
    asyncio.run(server.start())
    try:
        yield server
    finally:
        asyncio.run(server.stop())


@pytest.mark.temporal
@pytest.mark.timeout(TIMEOUT)
def test_fuzz_temporal(fuzz_temporal_server: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    temporal_server = fuzz_temporal_server

    def make() -> tuple[SettingsHarness, dict[str, Any]]:
        blobs = tmp_path_factory.mktemp("fuzz-blobs")
        settings = EngineSettings(
            driver="temporal",
            temporal_address=temporal_server.address,
            task_queue=f"fz-{uuid.uuid4().hex[:10]}",
            blob_url=f"file://{blobs}",
        )
        return SettingsHarness(settings, name="temporal"), {"start_concurrency": 2}

    fuzz(make, "temporal", default_cases=50)
