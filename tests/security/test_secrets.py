"""Secrets are never printed (issue 11, item 4): settings, the CLI and error messages show
configured URLs with their password, keys and tokens replaced by ``***``; ``s3://`` without
credentials is a clear error unless anonymous access is asked for."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from driver_native import Database
from engine_port import EngineSettings, Registry, SecretUrl, create_engine, redact_url
from engine_port._blobstores import open_blob_store
from engine_port.errors import ConfigurationError, DriverUnavailableError, EngineError
from tests.support.databases import PostgresSession
from wfe_cli import app

DB_PASSWORD = "Hunter2-db-pw"
ACCESS_KEY = "AKIAEXAMPLEACCESS"
SECRET_KEY = "wJalrXUtnFEMI-K7MDENG-secret"
TOKEN = "session-token-xyz"
SECRETS = (DB_PASSWORD, ACCESS_KEY, SECRET_KEY, TOKEN)

PG_URL = f"postgresql+psycopg://wfe:{DB_PASSWORD}@db.internal:5432/wfe?sslmode=prefer"
S3_URL = (
    f"s3://wfe-blobs/tenant?endpoint=minio:9000&access_key={ACCESS_KEY}"
    f"&secret_key={SECRET_KEY}&session_token={TOKEN}&secure=true"
)


def no_secret_in(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} leaked into: {text}"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.upper().startswith(("WFE_", "AWS_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


# -- settings ------------------------------------------------------------------------------


def test_repr_str_and_dumps_of_settings_show_no_password_or_key() -> None:
    s = EngineSettings(database_url=PG_URL, blob_url=S3_URL)
    for text in (repr(s), str(s), s.model_dump_json(), str(s.model_dump()), f"{s}"):
        no_secret_in(text)
        assert "wfe:***@db.internal:5432/wfe" in text  # still says where it points
        assert "endpoint=minio:9000" in text and "secret_key=***" in text
    # code that connects reads the real value, explicitly
    assert s.database_url.reveal() == PG_URL
    assert s.blob_url.get_secret_value() == S3_URL


def test_settings_from_the_environment_are_redacted_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WFE_DATABASE_URL", PG_URL)
    monkeypatch.setenv("WFE_BLOB_URL", S3_URL)
    s = EngineSettings()
    no_secret_in(repr(s) + s.model_dump_json())
    assert (s.database_url.reveal(), s.blob_url.reveal()) == (PG_URL, S3_URL)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:p%40ss/w?rd@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://h/db?user=u&password=pw", "postgresql://h/db?user=u&password=***"),
        ("s3://AK:SK@bucket/p?endpoint=e", "s3://AK:***@bucket/p?endpoint=e"),
        ("https://h/x?token=t&sig=s&x=1", "https://h/x?token=***&sig=***&x=1"),
        ("sqlite:///.wfe/wfe.db", "sqlite:///.wfe/wfe.db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert str(SecretUrl(url)) == shown


def test_a_password_read_two_ways_never_leaks_in_part() -> None:
    # SQLAlchemy ends the password at the first '@', urllib the authority at the first '?':
    # whichever way a URL is read, no part of a secret is shown.
    shown = redact_url("postgresql://h:5432/db?password=abc@defgh")
    assert "abc" not in shown and "defgh" not in shown


# -- the command line ----------------------------------------------------------------------


@pytest.mark.postgres
def test_wfe_demo_prints_the_database_url_without_its_password(
    pg_session: PostgresSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # the test server trusts local connections, so the password is accepted and ignored
    url = sa.make_url(pg_session.new_schema()).set(password=DB_PASSWORD)
    monkeypatch.setenv("WFE_DATABASE_URL", url.render_as_string(hide_password=False))
    monkeypatch.setenv("WFE_BLOB_URL", f"file://{tmp_path / 'blobs'}")
    result = CliRunner().invoke(app, ["demo"], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert "run.completed" in result.output
    assert f"postgresql+psycopg://{url.username}:***@" in result.output
    no_secret_in(result.output)


@pytest.mark.postgres
def test_wfe_conformance_connects_with_a_password_it_never_prints(
    pg_session: PostgresSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = sa.make_url(pg_session.new_schema()).set(password=DB_PASSWORD)
    monkeypatch.setenv("WFE_DATABASE_URL", url.render_as_string(hide_password=False))
    monkeypatch.setenv("WFE_BLOB_URL", f"file://{tmp_path / 'blobs'}")
    result = CliRunner().invoke(app, ["conformance", "-k", "s1_linear"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "test_s1_linear" in result.output and "passed" in result.output
    no_secret_in(result.output)


def test_wfe_demo_on_an_unreachable_database_prints_no_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WFE_DATABASE_URL", f"postgresql+psycopg://wfe:{DB_PASSWORD}@127.0.0.1:1/x")
    monkeypatch.setenv("WFE_DATABASE_RETRY_SECONDS", "1")
    result = CliRunner().invoke(app, ["demo"], terminal_width=400)
    assert result.exit_code == 5  # unavailable (wfe exit codes)
    assert "cannot reach the database at postgresql+psycopg://wfe:***@127.0.0.1:1/x" in (
        result.output
    )
    no_secret_in(result.output)


# -- errors and logs -----------------------------------------------------------------------


async def test_an_unreachable_database_error_carries_no_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"postgresql+psycopg://wfe:{DB_PASSWORD}@127.0.0.1:1/wfe?password={DB_PASSWORD}"
    engine = create_engine(EngineSettings(database_url=url, database_retry_seconds=1), Registry())
    with pytest.raises(DriverUnavailableError) as info:
        async with engine:
            pass
    assert "cannot reach the database" in str(info.value)
    no_secret_in(str(info.value))
    no_secret_in(caplog.text)


def test_an_unsupported_database_url_error_carries_no_password() -> None:
    with pytest.raises(DriverUnavailableError, match="is not supported") as info:
        Database(f"mysql://wfe:{DB_PASSWORD}@db/wfe")
    no_secret_in(str(info.value))


def test_blob_url_errors_carry_no_key() -> None:
    with pytest.raises(EngineError, match="unknown scheme") as info:
        open_blob_store(f"ftp://u:{SECRET_KEY}@h/x?token={TOKEN}")
    no_secret_in(str(info.value))
    with pytest.raises(ConfigurationError, match="only one of access_key") as info2:
        open_blob_store(f"s3://bucket-a?endpoint=h:1&secret_key={SECRET_KEY}", env={})
    no_secret_in(str(info2.value))


# -- s3 credentials ------------------------------------------------------------------------


def test_s3_without_credentials_is_a_clear_configuration_error() -> None:
    pytest.importorskip("minio")
    with pytest.raises(ConfigurationError) as info:
        open_blob_store("s3://wfe-blobs?endpoint=127.0.0.1:9000", env={})
    message = str(info.value)
    assert "no S3 credentials" in message
    assert "access_key=" in message and "AWS_ACCESS_KEY_ID" in message
    assert "anonymous=true" in message
    assert isinstance(info.value, EngineError)


def test_s3_keys_come_from_the_url_the_userinfo_or_the_environment() -> None:
    pytest.importorskip("minio")
    from engine_port._s3 import S3BlobStore

    def creds(store: object) -> tuple[str, str, str | None] | None:
        assert isinstance(store, S3BlobStore)
        provider = store._client._provider
        if provider is None:
            return None
        c = provider.retrieve()
        return (c.access_key, c.secret_key, c.session_token)

    base = "s3://wfe-blobs?endpoint=127.0.0.1:9000"
    env = {"AWS_ACCESS_KEY_ID": "envak", "AWS_SECRET_ACCESS_KEY": "envsk"}
    assert creds(open_blob_store(f"{base}&access_key=a&secret_key=b", env=env)) == ("a", "b", None)
    assert creds(open_blob_store("s3://a:b%2Fc@wfe-blobs?endpoint=e", env={})) == ("a", "b/c", None)
    assert creds(open_blob_store(base, env=env)) == ("envak", "envsk", None)
    assert creds(open_blob_store(base + "&anonymous=true", env={})) is None
    # no silent default keys any more
    assert creds(open_blob_store(base + "&anonymous=true", env={})) != ("minioadmin", "minioadmin")
