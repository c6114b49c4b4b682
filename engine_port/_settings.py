"""EngineSettings: environment (prefix ``WFE_``), then ``wfe.toml``, then defaults."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ._drivers import find_driver, installed_drivers, unknown_driver_message
from ._secrets import SecretUrl

__all__ = ["EngineSettings"]


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(
        # (no NaN or infinity: a timeout, lease or interval of either is no duration)
        env_prefix="WFE_",
        toml_file="wfe.toml",
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
    )

    # any installed driver: a "wfe.drivers" entry point (native, temporal, memory built in)
    driver: str = "native"
    # URLs may carry credentials: shown redacted everywhere, .reveal() gives the real value
    database_url: SecretUrl = SecretUrl("sqlite:///.wfe/wfe.db")
    blob_url: SecretUrl = SecretUrl("file://.wfe/blobs")
    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    # gRPC compression of the driver's Temporal connection: "auto" sends uncompressed to a
    # loopback address (gzip there only costs CPU on both ends: ~11 ms of a 1 -> 50 -> 1
    # fan-out's client CPU and ~5 ms of the dev server's) and gzip elsewhere (temporalio's
    # default, which saves bandwidth to a remote cluster)
    temporal_grpc_compression: Literal["auto", "gzip", "none"] = "auto"
    # the most stage activities one run has in flight on Temporal at once (more wait for a
    # slot, as pending jobs wait for a native worker): Temporal refuses a workflow more than
    # 2,000 pending activities by default, and each workflow task costs its server more the
    # more it holds (a 1 -> 2,000 fan-out never finished; see the README's Temporal section)
    temporal_max_stage_activities: int = Field(default=500, ge=1)
    task_queue: str = "wfe"
    # the Temporal Web UI (http://127.0.0.1:8233): `wfe ui` links each run to its history there
    temporal_ui_url: str | None = None
    spill_threshold_bytes: int = Field(default=64 * 1024, ge=0)
    app: str | None = None
    # where hosts deliver events: jsonl:///PATH or package.module:factory
    event_sink: str | None = None
    # native worker tuning
    worker_concurrency: int = Field(default=32, ge=1)
    lease_seconds: float = Field(default=30.0, gt=0)
    poll_interval_seconds: float = Field(default=0.05, gt=0)
    command_key_stale_seconds: float = Field(default=600.0, gt=0)
    # how long a call retries a database outage (a refused or dropped connection, a server
    # restarting) before it raises DriverUnavailableError
    database_retry_seconds: float = Field(default=10.0, gt=0)
    # event delivery: a failing sink is retried per event with exponential backoff (initial,
    # doubling, capped at max); an event is dead-lettered after dead_letter_after attempts
    # spanning at least outbox_dead_letter_min_seconds (the defaults ride out a sink outage of
    # a few minutes)
    dead_letter_after: int = Field(default=10, ge=1)
    outbox_dead_letter_min_seconds: float = Field(default=300.0, ge=0)
    outbox_retry_initial_seconds: float = Field(default=0.5, ge=0)
    outbox_retry_max_seconds: float = Field(default=30.0, ge=0)
    # routing for a mixed (migration) period: workflow id -> driver
    routes: dict[str, str] = Field(default_factory=dict)
    # bounded work (issue 11 items 5-6; see README "Limits")
    # threads for sync (non-async) stage bodies, per engine; blob I/O never shares them
    sync_stage_threads: int = Field(default=16, ge=1)
    # seconds an attempt of a stage without its own timeout= may run (None: no limit); one
    # day, the start-to-close the Temporal driver always used for such stages
    # at most 100 years, as a stage's own timeout= (a Temporal activity timeout past that
    # failed every workflow task of the run)
    default_stage_timeout: float | None = Field(default=86400.0, gt=0, le=36525 * 86400)
    # signals buffered (sent, not yet consumed) per run; the next one raises SignalQueueFullError
    max_pending_signals: int = Field(default=1000, ge=1)
    # largest JSON value (run input, signal payload, step result, stage output, one event's
    # data) accepted
    max_payload_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    # host settings (issue 16), shared by `wfe worker` and the serverless host; the seed's
    # camelCase names beside them (README "Hosts" says where the defaults deliberately differ)
    # staleLeaseThresholdMs: seconds without a heartbeat before a job's lease is reaped and
    # another worker takes it over; None: lease_seconds (30 s, the seed says 5 min)
    stale_lease_threshold: float | None = Field(default=None, gt=0)
    # jobAbsoluteTimeoutMs: cap on one attempt, whatever the stage's own timeout; 0 disables
    job_absolute_timeout: float = Field(default=3600.0, ge=0)
    # jobHeartbeatIntervalMs: how often a running job renews its lease; None: a third of the
    # lease, at most 0.5 s (the seed beats every 60 s against its 5 min lease)
    job_heartbeat_interval: float | None = Field(default=None, gt=0)
    max_claims_per_tick: int = Field(default=10, ge=1)  # maxClaimsPerTick
    max_suspended_checks_per_tick: int = Field(default=10, ge=1)  # maxSuspendedChecksPerTick
    max_outbox_flush_per_tick: int = Field(default=100, ge=1)  # maxOutboxFlushPerTick
    # serves: "all" claims every version in the database (a version this build lacks fails
    # its job as not served); None: the versions in the registry (safe rolling deploys)
    serves: Literal["all"] | None = None
    # retention: {olderThanMs}: seconds after which the worker and every maintenance tick
    # purge finished runs; None: off
    retention: float | None = Field(default=None, gt=0)

    @property
    def lease_threshold(self) -> float:
        """Seconds a job lease lasts without a heartbeat (``stale_lease_threshold``)."""
        return self.stale_lease_threshold or self.lease_seconds

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats of a running job (``job_heartbeat_interval``)."""
        return self.job_heartbeat_interval or min(self.lease_threshold / 3, 0.5)

    @model_validator(mode="after")
    def _beat_within_lease(self) -> Self:
        if self.heartbeat_interval >= self.lease_threshold:
            raise ValueError(
                f"job_heartbeat_interval ({self.heartbeat_interval}s) must be shorter than the "
                f"lease ({self.lease_threshold}s, stale_lease_threshold or lease_seconds), or "
                "every running job loses its lease between two heartbeats"
            )
        return self

    @field_validator("driver")
    @classmethod
    def _installed_driver(cls, name: str) -> str:
        if find_driver(name) is None:
            raise ValueError(unknown_driver_message(name, installed_drivers()))
        return name

    @field_validator("routes")
    @classmethod
    def _installed_route_drivers(cls, routes: dict[str, str]) -> dict[str, str]:
        for name in routes.values():
            if find_driver(name) is None:
                raise ValueError(unknown_driver_message(name, installed_drivers()))
        return routes

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))
