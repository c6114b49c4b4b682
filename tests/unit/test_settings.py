"""EngineSettings (defaults, WFE_ environment, wfe.toml) and create_engine's driver lookup."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import engine_port._drivers as drivers_module
from engine_port import EngineSettings, Registry, create_engine, load_settings
from engine_port.driver import installed_drivers
from engine_port.errors import ConfigurationError, DriverUnavailableError
from tests.support.entry_points import write_dist_info


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No WFE_ variable from the outside and no wfe.toml in the working directory."""
    import os

    for name in list(os.environ):
        if name.upper().startswith("WFE_"):
            monkeypatch.delenv(name)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_defaults() -> None:
    s = EngineSettings()
    assert s.driver == "native"
    assert s.database_url.reveal() == "sqlite:///.wfe/wfe.db"
    assert s.blob_url.reveal() == "file://.wfe/blobs"
    assert s.spill_threshold_bytes == 64 * 1024
    assert s.temporal_address == "127.0.0.1:7233"
    assert s.temporal_namespace == "default"
    assert s.task_queue == "wfe"
    assert s.app is None
    assert s.routes == {}


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WFE_DRIVER", "temporal")
    monkeypatch.setenv("WFE_DATABASE_URL", "postgresql+psycopg://u:p@db/wfe")
    monkeypatch.setenv("WFE_BLOB_URL", "s3://bucket?endpoint=minio:9000")
    monkeypatch.setenv("WFE_SPILL_THRESHOLD_BYTES", "1024")
    monkeypatch.setenv("WFE_TASK_QUEUE", "orders")
    monkeypatch.setenv("WFE_APP", "myapp.workflows:registry")
    monkeypatch.setenv("WFE_ROUTES", '{"order-processing": "temporal"}')
    s = EngineSettings()
    assert s.driver == "temporal"
    assert s.database_url.reveal() == "postgresql+psycopg://u:p@db/wfe"
    assert s.blob_url.reveal() == "s3://bucket?endpoint=minio:9000"
    assert s.spill_threshold_bytes == 1024
    assert s.task_queue == "orders"
    assert s.app == "myapp.workflows:registry"
    assert s.routes == {"order-processing": "temporal"}


def test_lowercase_environment_names_work_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("wfe_task_queue", "lower")
    assert EngineSettings().task_queue == "lower"


def test_wfe_toml_in_the_working_directory_is_read(clean_env: Path) -> None:
    (clean_env / "wfe.toml").write_text(
        'driver = "temporal"\n'
        'database_url = "sqlite:///from-toml.db"\n'
        "spill_threshold_bytes = 2048\n"
        "[routes]\n"
        'billing = "native"\n'
    )
    s = EngineSettings()
    assert s.driver == "temporal"
    assert s.database_url.reveal() == "sqlite:///from-toml.db"
    assert s.spill_threshold_bytes == 2048
    assert s.routes == {"billing": "native"}
    assert s.blob_url.reveal() == "file://.wfe/blobs"  # untouched default


def test_environment_wins_over_wfe_toml_and_arguments_win_over_both(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (clean_env / "wfe.toml").write_text('task_queue = "toml"\ndriver = "temporal"\n')
    monkeypatch.setenv("WFE_TASK_QUEUE", "env")
    s = EngineSettings()
    assert (s.task_queue, s.driver) == ("env", "temporal")
    assert EngineSettings(task_queue="arg").task_queue == "arg"


def test_unknown_driver_value_raises_validation_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="driver"):
        EngineSettings(driver="oracle")
    monkeypatch.setenv("WFE_DRIVER", "oracle")
    with pytest.raises(ValidationError, match="driver"):
        EngineSettings()


def test_unknown_driver_in_wfe_toml_raises_validation_error(clean_env: Path) -> None:
    (clean_env / "wfe.toml").write_text('driver = "oracle"\n')
    with pytest.raises(ValidationError, match="driver"):
        EngineSettings()


def test_unknown_setting_in_wfe_toml_is_rejected(clean_env: Path) -> None:
    (clean_env / "wfe.toml").write_text('databse_url = "typo"\n')
    with pytest.raises(ValidationError, match="databse_url"):
        EngineSettings()


def test_negative_threshold_is_rejected() -> None:
    with pytest.raises(ValidationError, match="spill_threshold_bytes"):
        EngineSettings(spill_threshold_bytes=-1)


def test_urls_are_given_as_plain_strings_and_read_back_with_reveal(clean_env: Path) -> None:
    url = "postgresql+psycopg://wfe:hunter2@db/wfe"
    s = EngineSettings(database_url=url, blob_url="file:///tmp/b")
    assert s.database_url.reveal() == url
    assert EngineSettings(database_url=s.database_url).database_url.reveal() == url
    assert str(s.database_url) == "postgresql+psycopg://wfe:***@db/wfe"
    assert s.database_url == EngineSettings(database_url=url).database_url
    (clean_env / "wfe.toml").write_text(f'database_url = "{url}"\n')
    assert EngineSettings().database_url.reveal() == url


def test_settings_are_frozen() -> None:
    s = EngineSettings()
    with pytest.raises(ValidationError):
        s.driver = "temporal"  # type: ignore[misc]


# -- create_engine ---------------------------------------------------------------------------


def use_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str, dist: str = "acme-wfe"
) -> None:
    """Install a package with the ``wfe.drivers`` entry point ``name = value`` for this test."""
    site = tmp_path / "site"
    write_dist_info(site, dist, {name: value})
    monkeypatch.syspath_prepend(str(site))


def test_installed_drivers_are_read_only_and_list_the_built_ins() -> None:
    installed = installed_drivers()
    assert {"native", "temporal", "memory"} <= set(installed)
    with pytest.raises(TypeError):
        installed["x"] = installed["native"]  # type: ignore[index]


def test_a_package_with_a_wfe_drivers_entry_point_adds_a_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(ValidationError, match=r"unknown driver 'acme'; installed drivers: "):
        EngineSettings(driver="acme")
    use_driver(monkeypatch, tmp_path, "acme", "wfe_acme_driver:create")
    assert installed_drivers()["acme"].value == "wfe_acme_driver:create"
    assert EngineSettings(driver="acme").driver == "acme"
    assert EngineSettings(routes={"wf": "acme"}).routes == {"wf": "acme"}


def test_an_unknown_driver_is_one_configuration_error_naming_the_installed_ones() -> None:
    with pytest.raises(ConfigurationError) as exc:
        load_settings(driver="oracle")
    message = str(exc.value)
    assert "\n" not in message
    assert "unknown driver 'oracle'" in message
    assert all(name in message for name in ("memory", "native", "temporal"))
    with pytest.raises(ConfigurationError, match="unknown driver 'oracle'"):
        load_settings(routes={"wf": "oracle"})


def test_create_engine_with_a_driver_that_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shipped = {
        **drivers_module._SHIPPED,
        "temporal": drivers_module._builtin(
            "temporal", "wfe_no_such_driver_module:create_temporal_engine", "temporal"
        ),
    }
    monkeypatch.setattr(drivers_module, "_SHIPPED", shipped)
    # an installation whose metadata predates the entry points (the installed ones would win)
    monkeypatch.setattr(drivers_module.importlib.metadata, "entry_points", lambda **_: [])
    with pytest.raises(DriverUnavailableError, match=r"pip install 'wfe\[temporal\]'") as exc:
        create_engine(EngineSettings(driver="temporal"), Registry())
    assert "wfe_no_such_driver_module" in str(exc.value)


def test_an_engine_of_a_shipped_driver_reads_no_package_metadata(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Reading every installed package's entry points took ~20 ms here, and create_engine
    read them three times (the driver, the routes, the factory): most of what building an
    engine took, paid per invocation by a serverless handler that builds one each time."""
    reads: list[object] = []
    real = drivers_module.importlib.metadata.entry_points

    def counted(**kwargs: Any) -> Any:
        reads.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(drivers_module.importlib.metadata, "entry_points", counted)
    settings = EngineSettings(
        driver="memory", routes={"wf": "native"}, database_url=f"sqlite:///{tmp_path}/x.db"
    )
    create_engine(settings, Registry())
    assert reads == []
    # a name that no shipped driver has is looked up in the metadata, as before
    use_driver(monkeypatch, tmp_path, "acme", "driver_memory:create_memory_engine")
    assert EngineSettings(driver="acme").driver == "acme" and reads


def test_a_package_cannot_take_a_shipped_drivers_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_driver(monkeypatch, tmp_path, "native", "wfe_no_such_driver_module:create")
    assert installed_drivers()["native"] == drivers_module._SHIPPED["native"]
    assert drivers_module.load_driver("native").__name__ == "create_native_engine"


def test_a_third_party_driver_whose_package_is_gone_says_what_to_reinstall(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_driver(monkeypatch, tmp_path, "acme", "wfe_no_such_driver_module:create")
    with pytest.raises(DriverUnavailableError, match="reinstall acme-wfe"):
        create_engine(EngineSettings(driver="acme"), Registry())


def test_create_engine_with_a_missing_third_party_dependency(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pkg = tmp_path / "wfe_fake_driver"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import wfe_missing_third_party_lib\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    use_driver(monkeypatch, tmp_path, "fake", "wfe_fake_driver:create")
    with pytest.raises(DriverUnavailableError, match="reinstall acme-wfe") as exc:
        create_engine(EngineSettings(driver="fake"), Registry())
    assert "wfe_missing_third_party_lib" in str(exc.value)


def test_create_engine_does_not_hide_a_broken_import_inside_the_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pkg = tmp_path / "wfe_buggy_driver"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from engine_port import NoSuchName\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    use_driver(monkeypatch, tmp_path, "buggy", "wfe_buggy_driver:create")
    with pytest.raises(ImportError, match="NoSuchName") as exc:
        create_engine(EngineSettings(driver="buggy"), Registry())
    assert not isinstance(exc.value, DriverUnavailableError)


def test_create_engine_passes_settings_registry_and_ports_to_the_factory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pkg = tmp_path / "wfe_recording_driver"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "calls = []\n"
        "def create(settings, registry, **kw):\n"
        "    calls.append((settings, registry, kw))\n"
        "    return 'engine'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    use_driver(monkeypatch, tmp_path, "recording", "wfe_recording_driver:create")
    settings, registry = EngineSettings(driver="recording"), Registry()
    engine: Any = create_engine(settings, registry, extra_option=1)
    assert engine == "engine"
    wfe_recording_driver = importlib.import_module("wfe_recording_driver")

    [(got_settings, got_registry, kw)] = wfe_recording_driver.calls
    assert got_settings is settings and got_registry is registry
    assert kw == {
        "event_sink": None,
        "blob_store": None,
        "clock": None,
        "extra_option": 1,
    }


async def test_unusable_urls_and_addresses_are_configuration_errors(clean_env: Path) -> None:
    """A database_url that is no URL was SQLAlchemy's ArgumentError, a temporal_address with a
    bad port temporalio's ValueError; an event_sink ``jsonl://`` naming no file (or a folder)
    was taken, and every event delivery then failed until it was a dead letter."""
    (clean_env / "folder").mkdir()
    cases = [
        ({"database_url": "not a url"}, "database_url 'not a url' is not a URL"),
        ({"driver": "temporal", "temporal_address": "nohost:99999"}, "use HOST:PORT"),
        ({"event_sink": "jsonl://"}, "names no file"),
        ({"event_sink": f"jsonl://{clean_env / 'folder'}"}, "names no file"),
        ({"event_sink": "no_such_module_x:factory"}, "cannot load event sink"),
    ]
    for values, says in cases:
        with pytest.raises(ConfigurationError, match=says):
            async with create_engine(load_settings(**values), Registry([])):
                pass


def test_durations_are_finite_and_a_default_stage_timeout_at_most_a_century() -> None:
    """NaN or infinity was taken for every duration setting (a lease of NaN seconds), and a
    default stage timeout past Temporal's range failed every workflow task of a run."""
    for values in (
        {"default_stage_timeout": float("inf")},
        {"lease_seconds": float("nan")},
        {"poll_interval_seconds": float("inf")},
        {"default_stage_timeout": 1e12},
    ):
        with pytest.raises(ConfigurationError):
            load_settings(**values)
    assert load_settings(default_stage_timeout=36525 * 86400).default_stage_timeout > 0


@pytest.mark.parametrize("value", ["", "{bad", "not json"])
def test_a_routes_variable_that_is_not_json_is_one_configuration_error(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """pydantic-settings parses WFE_ROUTES as JSON and raised its own SettingsError ("wfe
    runs": "unexpected SettingsError ... this is a bug"); create_engine() without settings
    let pydantic's errors through."""
    monkeypatch.setenv("WFE_ROUTES", value)
    with pytest.raises(ConfigurationError, match=r"WFE_ROUTES is not valid JSON.*dict"):
        load_settings()
    with pytest.raises(ConfigurationError, match="WFE_ROUTES"):
        create_engine(None, Registry())
    monkeypatch.setenv("WFE_ROUTES", "{}")
    monkeypatch.setenv("WFE_POLL_INTERVAL_SECONDS", "soon")
    with pytest.raises(ConfigurationError, match="WFE_POLL_INTERVAL_SECONDS is invalid"):
        create_engine(None, Registry())
