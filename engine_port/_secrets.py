"""Secrets in settings: URLs that may carry a password, keys or tokens.

:func:`redact_url` is the one place that decides what of a URL is secret; every message, log
line, ``repr`` and CLI output that shows a configured URL goes through it. :class:`SecretUrl`
holds such a URL in :class:`~engine_port.EngineSettings`: it shows itself redacted everywhere
(``str``, ``repr``, ``model_dump``, ``model_dump_json``), and code that connects asks for the
real value with :meth:`SecretUrl.reveal`.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

__all__ = ["MASK", "SecretUrl", "redact_text", "redact_url"]

MASK = "***"

# Query parameters whose value is a secret: any name containing one of these words
# (password, sslpassword, secret_key, access_key, token, session_token, sig, signature, auth...).
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key|sig|auth|cred", re.IGNORECASE)
# SQLAlchemy's reading of ``scheme://user:password@...``: the password runs to the first '@'.
_USERINFO = re.compile(r"^[A-Za-z][\w+.\-]*://(?P<user>[^:/@?#]*):(?P<pw>[^@]*)@")


def _query_spans(text: str, start: int) -> list[tuple[int, int]]:
    """Spans of the values of secret-named parameters in the query ``text[start:]``."""
    spans: list[tuple[int, int]] = []
    end = text.find("#", start)
    end = len(text) if end < 0 else end
    pos = start
    for part in re.split(r"[&;]", text[start:end]):
        name, eq, value = part.partition("=")
        if eq and value and _SECRET_PARAM.search(name):
            value_at = pos + len(name) + 1
            spans.append((value_at, value_at + len(value)))
        pos += len(part) + 1
    return spans


def _secret_spans(url: str) -> list[tuple[int, int]]:
    """Character spans of ``url`` that are secret, under both ways a URL is commonly read
    (SQLAlchemy's: the password ends at the first '@'; urllib's: the authority ends at the
    first '/', '?' or '#'), so that neither reading can leak a part of a secret."""
    spans: list[tuple[int, int]] = []
    m = _USERINFO.match(url)
    if m:
        spans.append(m.span("pw"))
    scheme_end = url.find("://")
    if scheme_end >= 0:
        rest = scheme_end + 3
        authority_end = len(url)
        for sep in "/?#":
            i = url.find(sep, rest)
            if i >= 0:
                authority_end = min(authority_end, i)
        at = url.rfind("@", rest, authority_end)
        if at >= 0:
            colon = url.find(":", rest, at)
            if colon >= 0:
                spans.append((colon + 1, at))
    q = url.find("?")
    if q >= 0:
        spans += _query_spans(url, q + 1)
    if m:
        # the query as SQLAlchemy reads it: after the database part, past the password
        q2 = url.find("?", m.end())
        if q2 >= 0 and q2 != q:
            spans += _query_spans(url, q2 + 1)
    return [(a, b) for a, b in spans if b > a]


def redact_url(url: str) -> str:
    """``url`` with its password, and the values of query parameters that hold keys, tokens or
    passwords, replaced by ``***``: ``postgresql://wfe:***@db/wfe``,
    ``s3://bucket?endpoint=minio:9000&access_key=***&secret_key=***``. Never raises."""
    try:
        spans = sorted(_secret_spans(url))
    except Exception:  # a URL no reader understands: show only its scheme
        scheme, sep, _ = url.partition("://")
        return f"{scheme}://{MASK}" if sep else MASK
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    out: list[str] = []
    pos = 0
    for a, b in merged:
        out += [url[pos:a], MASK]
        pos = b
    out.append(url[pos:])
    return "".join(out)


def _secrets_of(url: str) -> list[str]:
    try:
        return [url[a:b] for a, b in _secret_spans(url)]
    except Exception:
        return [url]


def redact_text(text: str, *urls: str) -> str:
    """``text`` (an error message from a database or S3 client, say) with every secret of
    ``urls`` replaced by ``***``, and every occurrence of a whole URL by its redacted form."""
    for url in urls:
        if url and url in text:
            text = text.replace(url, redact_url(url))
        for secret in sorted(_secrets_of(url), key=len, reverse=True):
            if len(secret) >= 3:
                text = text.replace(secret, MASK)
    return text


class SecretUrl:
    """A URL that may carry credentials. Shows itself redacted (``str``, ``repr``, pydantic
    dumps); :meth:`reveal` returns the real value for the code that connects."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if isinstance(value, SecretUrl):
            value = value.reveal()
        if not isinstance(value, str):
            raise TypeError(f"a URL must be a string, not {type(value).__name__}")
        self._value = value

    def reveal(self) -> str:
        """The real URL, credentials included: only for code that connects with it."""
        return self._value

    get_secret_value = reveal  # the name pydantic's SecretStr uses

    def redacted(self) -> str:
        return redact_url(self._value)

    def __str__(self) -> str:
        return self.redacted()

    def __repr__(self) -> str:
        return f"SecretUrl({self.redacted()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretUrl) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __bool__(self) -> bool:
        return bool(self._value)

    # -- pydantic ----------------------------------------------------------------------------
    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        from_str = core_schema.no_info_after_validator_function(cls, core_schema.str_schema())
        return core_schema.json_or_python_schema(
            json_schema=from_str,
            python_schema=core_schema.union_schema([core_schema.is_instance_schema(cls), from_str]),
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v: v.redacted() if isinstance(v, SecretUrl) else redact_url(str(v)),
                when_used="always",
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"type": "string", "format": "uri", "writeOnly": True}
