"""A request row's body as TorchServe delivers it (bytes, a string, or JSON it parsed), decoded to text or JSON
by its Content-Type; the one-line error that stops it is raised. Pure."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from bucketing.protocols.base import UnsupportedMediaType, bad

BODY_KEYS = ("body", "data")
BOM = "\ufeff"


def decode(row: Any, content_type: str | None) -> Any:
    """A request row's body as text or JSON (None when empty); raises the error that stops it.

    The rule for JSON: a JSON Content-Type (`application/json`, `text/json`, `...+json`, any parameters) is
    parsed as JSON; any other `text/*` is always one text; a body sent with no Content-Type at all (Python
    `requests` with `data=`, httpx with `content=`) is parsed as JSON when it starts with `{`, and is one text
    otherwise. A leading UTF-8 byte-order mark is dropped first. A JSON envelope is never embedded as text.
    """
    if not isinstance(row, Mapping):
        raise bad("InvalidRequest", f"unexpected request shape {type(row).__name__}")
    key = next((k for k in BODY_KEYS if k in row), None)
    if key is None:
        if row or "form" in (content_type or "").lower():
            raise UnsupportedMediaType(
                "UnsupportedMediaType",
                "the body arrived as form fields (curl without -H 'Content-Type: ...' sends "
                "application/x-www-form-urlencoded); send it as text/plain or application/json",
            )
        return None
    value = row[key]
    if isinstance(value, (bytes, bytearray)):
        if not value:
            return None
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise bad("InvalidEncoding", f"the body is not valid UTF-8 (byte {e.start}: {e.reason})") from None
    elif isinstance(value, str):  # TorchServe decodes a text/* body (text/json too) to a string itself
        text = value
    else:  # TorchServe parsed an application/json body itself
        return value
    text = text.removeprefix(BOM)  # a byte-order mark says how the body is encoded; it is not content
    ctype = (content_type or "").strip().lower()
    media = ctype.split(";", 1)[0].strip()
    sniffed = not ctype and text.lstrip()[:1] == "{"
    if not (media.endswith("/json") or media.endswith("+json") or sniffed):
        return text
    try:
        return json.loads(text)
    except ValueError as e:  # JSONDecodeError, or an integer too long to convert
        if not isinstance(e, json.JSONDecodeError):
            raise bad(
                "InvalidJSON",
                f"the body is not valid JSON here: it holds an integer of more than "
                f"{sys.get_int_max_str_digits()} digits",
            ) from None
        hint = (
            " (no Content-Type was sent and the body starts with '{', so it was read as JSON; "
            "send Content-Type: text/plain to embed it as text)"
            if sniffed
            else ""
        )
        where = f"at line {e.lineno} column {e.colno}"
        raise bad("InvalidJSON", f"the body is not valid JSON: {e.msg} {where}{hint}") from None
