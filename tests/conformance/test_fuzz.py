"""The differential fuzzer: generated cases on each driver, compared with the reference model
(conformance/_model.py). Deterministic in CI (derandomized, no example database).

Each hypothesis example is a batch of cases run on ONE fresh engine + worker; a failing batch
is shrunk by hypothesis (each shrink step on a fresh engine) towards the smallest failing case,
and the failure lists every divergent case as ready-to-paste code. Knobs (``./dev fuzz``):
WFE_FUZZ_CASES (per target; default 100 on native, 50 on Temporal, where each generated workflow
registers a Worker Deployment and a batch costs several times a native one),
WFE_FUZZ_SEED (default: derandomized),
WFE_FUZZ_GAPS=none (also draw the known gaps, conformance._cases.KNOWN_GAPS),
WFE_FUZZ_SHRINK=0 (report the first failing batch without shrinking),
WFE_FUZZ_CONTINUE_AS_NEW=N (Temporal: every run continues as new once its history holds N
events, at its next safe point: 1 continues at every safe point; default: the driver's).
Every run first tries ``conformance._cases.REGRESSIONS``, the cases that once found a fault, as
one batch.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st

from conformance import SettingsHarness, _fuzz
from conformance._cases import (
    KNOWN_GAPS,
    REGRESSIONS,
    Case,
    cases,
    fixed_draws,
    regression_batch,
)
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


def continue_as_new_options(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The Temporal engine options of ``WFE_FUZZ_CONTINUE_AS_NEW`` (``continue_as_new_events``):
    none when unset."""
    raw = env.get("WFE_FUZZ_CONTINUE_AS_NEW", "").strip()
    if not raw:
        return {}
    try:
        events = int(raw)
    except ValueError:
        events = 0
    if events < 1:
        raise ValueError(
            f"WFE_FUZZ_CONTINUE_AS_NEW={raw!r}: give a number of history events >= 1 past "
            "which a run continues as new (1: at every safe point), or leave it unset"
        )
    return {"continue_as_new_events": events}


def fuzz(
    make_harness: Callable[[], tuple[SettingsHarness, dict[str, Any]]],
    target: str,
    default_cases: int = 100,
    *,
    runner: Callable[[list[Case]], None] | None = None,
) -> None:
    """``runner``: what runs one batch (default: on a fresh harness, checked with the model)."""
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
    @example(regression_batch(gaps))  # (explicit examples go first)
    def run(batch: list[Case]) -> None:
        if runner is not None:
            runner(batch)
            return
        harness, extra = make_harness()
        results = asyncio.run(run_batch(harness, batch, **extra))
        check_batch(results, target)

    if fixed_seed is not None:
        run = seed(fixed_seed)(run)
    with fixed_draws():  # (the same cases whatever this process imported before)
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
        harness = SettingsHarness(settings, name="temporal", options=continue_as_new_options())
        return harness, {"start_concurrency": 2}

    fuzz(make, "temporal", default_cases=50)


def test_every_run_tries_the_regressions_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cases that once found a fault go first, as one batch, then the generated ones."""
    monkeypatch.setenv("WFE_FUZZ_CASES", "1")
    monkeypatch.delenv("WFE_FUZZ_SEED", raising=False)
    tried: list[list[Case]] = []

    def unused() -> tuple[SettingsHarness, dict[str, Any]]:
        raise AssertionError("the runner given runs the batches")

    fuzz(unused, "recorded", runner=tried.append)
    assert tried[0] == regression_batch()
    assert len(tried) >= 2 and all(len(b) == BATCH for b in tried[1:])


def test_the_continue_as_new_knob_gives_the_temporal_option() -> None:
    assert continue_as_new_options({}) == {}
    assert continue_as_new_options({"WFE_FUZZ_CONTINUE_AS_NEW": "1"}) == {
        "continue_as_new_events": 1
    }
    for bad in ("0", "-3", "often"):
        with pytest.raises(ValueError, match="WFE_FUZZ_CONTINUE_AS_NEW"):
            continue_as_new_options({"WFE_FUZZ_CONTINUE_AS_NEW": bad})


def test_the_regressions_pass_on_native_sqlite(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each regression case, on a fresh engine: what once found a fault stays fixed."""

    def url() -> str:
        return f"sqlite:///{tmp_path_factory.mktemp('fuzz-db') / 'wfe.db'}"

    harness, extra = _native(url, tmp_path_factory)()
    check_batch(
        asyncio.run(run_batch(harness, regression_batch(), case_timeout=60, **extra)),
        "native-sqlite",
    )


@pytest.mark.postgres
def test_the_regressions_pass_on_native_postgres(
    pg_session: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    harness, extra = _native(pg_session.new_schema, tmp_path_factory)()
    results = asyncio.run(run_batch(harness, regression_batch(), case_timeout=60, **extra))
    check_batch(results, "native-postgres")


@pytest.mark.temporal
def test_the_regressions_pass_on_temporal_continuing_as_new(
    fuzz_temporal_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With ``WFE_FUZZ_CONTINUE_AS_NEW=1`` every run continues as new at each safe point (a
    wait on a signal, a timer): the cases still observe what the model says, and their runs
    did continue (more than one Temporal execution of a workflow id)."""
    from temporalio.client import Client

    address = fuzz_temporal_server.address
    settings = EngineSettings(
        driver="temporal",
        temporal_address=address,
        task_queue=f"fz-{uuid.uuid4().hex[:10]}",
        blob_url=f"file://{tmp_path_factory.mktemp('fuzz-blobs')}",
    )
    options = continue_as_new_options({"WFE_FUZZ_CONTINUE_AS_NEW": "1"})
    harness = SettingsHarness(settings, name="temporal", options=options)
    results = asyncio.run(run_batch(harness, regression_batch(), start_concurrency=2))
    check_batch(results, "temporal")
    run_ids = [r.actual["run_id"] for r in results if r.actual is not None]

    async def executions() -> dict[str, int]:
        client = await Client.connect(address)
        deadline = time.monotonic() + 60
        while True:
            counts = {
                run_id: len([x async for x in client.list_workflows(f'WorkflowId = "{run_id}"')])
                for run_id in run_ids
            }
            if any(n > 1 for n in counts.values()) or time.monotonic() > deadline:
                return counts
            await asyncio.sleep(0.2)  # (visibility lags the executions a little)

    counts = asyncio.run(executions())
    assert any(n > 1 for n in counts.values()), counts


def test_early_signals_sent_late_still_reach_a_run_that_is_redriven(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner slow to send the early signals (a loaded host) still sends them before the
    first group of a case that redrives can fail the run: a ``during`` signal the failed run
    refused was lost, and the redriven run's wait for it hung."""
    sent_early = _fuzz._Signals.early

    async def late(self: Any, *args: Any) -> None:
        await asyncio.sleep(0.5)  # (a slow runner, not an ordering: the barrier orders)
        await sent_early(self, *args)

    monkeypatch.setattr(_fuzz._Signals, "early", late)
    (case,) = [c for c in REGRESSIONS if c.label == "early signals vs a redriven failure"]

    def url() -> str:
        return f"sqlite:///{tmp_path_factory.mktemp('fuzz-db') / 'wfe.db'}"

    harness, _ = _native(url, tmp_path_factory)()
    check_batch(asyncio.run(run_batch(harness, [case], case_timeout=30)), "native-sqlite")
