"""Open a BlobStore from a URL: ``file://<folder>``, ``memory://``, or
``s3://<bucket>?endpoint=<host:port>&access_key=..&secret_key=..&secure=false``.

S3 credentials come from the URL (``access_key``/``secret_key`` in the query, or
``s3://ACCESS:SECRET@bucket``), else from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (and
``AWS_SESSION_TOKEN``) in the environment; without any, only ``anonymous=true`` opens the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from ._blobs import BlobStore, FolderBlobStore, MemoryBlobStore, check_key
from ._secrets import SecretUrl, redact_url
from .errors import ConfigurationError, DriverUnavailableError, UnsafeBlobKeyError

__all__ = ["delete_prefixes", "open_blob_store"]


def _remove_folders(root: Path, prefixes: Sequence[str]) -> None:
    for prefix in prefixes:
        path = (root / prefix).resolve()
        if path == root or not path.is_relative_to(root):
            raise UnsafeBlobKeyError(prefix)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path)


async def delete_prefixes(store: BlobStore, prefixes: Sequence[str]) -> None:
    """Delete every blob under each of ``prefixes`` (folder-like keys such as ``runs/<id>/``).

    Work is proportional to what is deleted, never to the store's size: a folder store removes
    each prefix's directory in one worker thread (the event loop never walks the tree); other
    stores list by prefix (S3 and the database filter server-side) and delete what they list.
    """
    for prefix in prefixes:
        check_key(prefix.rstrip("/"))
    if isinstance(store, FolderBlobStore):
        await asyncio.to_thread(_remove_folders, store.root, list(prefixes))
        return
    for prefix in prefixes:
        for key in await store.list(prefix):
            await store.delete(key)


_TRUE = ("1", "true", "yes")


def _s3_credentials(
    url: str, userinfo: str, q: Mapping[str, str], env: Mapping[str, str]
) -> tuple[str | None, str | None, str | None]:
    """(access key, secret key, session token), or three Nones for anonymous access."""
    user, colon, password = userinfo.partition(":")
    access = q.get("access_key") or (unquote(user) if colon else None)
    secret = q.get("secret_key") or (unquote(password) if colon else None)
    token = q.get("session_token")
    if access is None and secret is None:
        access = env.get("AWS_ACCESS_KEY_ID") or None
        secret = env.get("AWS_SECRET_ACCESS_KEY") or None
        token = token or env.get("AWS_SESSION_TOKEN") or None
    anonymous = q.get("anonymous", "false").lower() in _TRUE
    if access and secret:
        if anonymous:
            raise ConfigurationError(
                f"blob_url {redact_url(url)!r} asks for anonymous access and gives keys; "
                "drop anonymous=true, or the keys"
            )
        return access, secret, token
    if anonymous and not (access or secret):
        return None, None, None
    if access or secret:
        raise ConfigurationError(
            f"blob_url {redact_url(url)!r} has only one of access_key and secret_key; "
            "give both (or neither, with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY set)"
        )
    raise ConfigurationError(
        f"blob_url {redact_url(url)!r} has no S3 credentials; add access_key=..&secret_key=.. "
        "to it (or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or add anonymous=true "
        "for a public bucket"
    )


# seconds an S3 request may wait for the server's answer (each of its 3 tries): a server that
# accepts connections but does not answer is a storage fault within ~2 minutes, not ~8
DEFAULT_S3_READ_TIMEOUT = 30.0


def _seconds(url: str, q: Mapping[str, str], name: str, default: float) -> float:
    """The positive number of seconds of query parameter ``name`` of blob_url ``url``."""
    raw = q.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ConfigurationError(
            f"blob_url {redact_url(url)!r} has {name}={raw!r}; give a positive number of "
            f"seconds (e.g. {name}=30)"
        )
    return value


def _s3_endpoint(url: str, q: Mapping[str, str]) -> tuple[str, bool]:
    """``(host:port, secure)`` from an ``s3://`` blob_url's ``endpoint`` (``host:port``, or
    ``http://host:port`` / ``https://host:port`` as AWS SDKs write it) and ``secure``."""
    endpoint = q.get("endpoint", "127.0.0.1:9000")
    secure = q.get("secure", "false").lower() in _TRUE
    scheme, sep, rest = endpoint.partition("://")
    if sep:
        if scheme.lower() not in ("http", "https"):
            raise ConfigurationError(
                f"blob_url {redact_url(url)!r} has endpoint scheme {scheme!r}; give "
                "endpoint=HOST:PORT (or http:// or https:// before it)"
            )
        if "secure" in q and secure != (scheme.lower() == "https"):
            raise ConfigurationError(
                f"blob_url {redact_url(url)!r} has an {scheme} endpoint and secure="
                f"{q['secure']}; drop secure= (the endpoint's scheme says it)"
            )
        endpoint, secure = rest, scheme.lower() == "https"
    if not endpoint or "/" in endpoint.rstrip("/"):
        raise ConfigurationError(
            f"blob_url {redact_url(url)!r} has endpoint {endpoint!r}; give HOST:PORT with no "
            "path (the bucket is the URL's host: s3://BUCKET?endpoint=HOST:PORT)"
        )
    return endpoint.rstrip("/"), secure


_S3_PARAMETERS = frozenset(
    {
        "endpoint",
        "secure",
        "region",
        "timeout",
        "access_key",
        "secret_key",
        "session_token",
        "anonymous",
    }
)
"""What an ``s3://`` blob_url's query may say (anything else is a typo: refused)."""


def open_blob_store(url: str | SecretUrl, *, env: Mapping[str, str] | None = None) -> BlobStore:
    """The BlobStore ``url`` names (``env`` defaults to ``os.environ``, for S3 keys)."""
    url = url.reveal() if isinstance(url, SecretUrl) else url
    parsed = urlparse(url)
    if parsed.scheme == "file":
        path = (parsed.netloc + parsed.path) if parsed.netloc else parsed.path
        return FolderBlobStore(path or ".")
    if parsed.scheme == "memory":
        return MemoryBlobStore()
    if parsed.scheme == "s3":
        try:
            from minio.helpers import check_bucket_name

            from ._s3 import S3BlobStore
        except ImportError:
            raise DriverUnavailableError(
                "s3:// blob storage needs the minio client; install it with: pip install 'wfe[s3]'"
            ) from None
        q = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        unknown = sorted(set(q) - _S3_PARAMETERS)
        if unknown:
            raise ConfigurationError(
                f"blob_url {redact_url(url)!r} has unknown parameter(s) {', '.join(unknown)}; "
                f"an s3:// blob_url takes {', '.join(sorted(_S3_PARAMETERS))}"
            )
        userinfo, _, bucket = parsed.netloc.rpartition("@")
        if not bucket:
            raise ConfigurationError(
                f"blob_url {redact_url(url)!r} names no bucket; use s3://BUCKET?endpoint=HOST"
            )
        try:
            check_bucket_name(bucket)
        except ValueError as exc:
            raise ConfigurationError(
                f"blob_url {redact_url(url)!r}: the S3 bucket name {bucket!r} is invalid "
                f"({exc}); use 3-63 lowercase letters, digits, '.' or '-' "
                "(s3://BUCKET?endpoint=HOST:PORT)"
            ) from None
        access, secret, token = _s3_credentials(
            url, userinfo, q, os.environ if env is None else env
        )
        endpoint, secure = _s3_endpoint(url, q)
        return S3BlobStore(
            bucket=bucket,
            endpoint=endpoint,
            access_key=access,
            secret_key=secret,
            session_token=token,
            secure=secure,
            region=q.get("region"),
            prefix=parsed.path.strip("/"),
            read_timeout=_seconds(url, q, "timeout", DEFAULT_S3_READ_TIMEOUT),
        )
    raise ConfigurationError(
        f"blob_url {redact_url(url)!r} has an unknown scheme; use file://FOLDER, memory:// or "
        "s3://BUCKET"
    )
