"""A request row's body as TorchServe delivers it (bytes, a string, or JSON it parsed), decoded once to text or JSON
by its Content-Type; the one-line error that stops it is raised. Pure."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from bucketing.protocols.base import UnsupportedMediaType, bad

BODY_KEYS = ("body", "data")
BOM = "\ufeff"
# TorchServe's worker (ts/protocol/otf_message_handler.py, `_retrieve_input_data`) json.loads a body whose type is
# exactly this (the frontend keeps only the media type) and decodes a `text*` one to a string; any other comes as bytes.
TORCHSERVE_PARSES = "application/json"
UNTYPED = ("", "application/octet-stream")  # types that say nothing of the content: the body is sniffed


class Text(str):
    """A body that is one text (`text/*`, a type that is not JSON, or an untyped body not starting with `{`); a JSON
    value that is a string stays a plain `str`, never a text to embed nor a second envelope."""


def decode(row: Any, content_type: str | None) -> Any:
    """A request row's body as `Text` or a JSON value (None when empty), decoded once; raises the error that stops it.

    The rule for JSON: a JSON Content-Type (`application/json`, `text/json`, `...+json`, any parameters) is
    parsed as JSON, once (what TorchServe parsed itself is taken as it is); any other type is one text; a body
    whose type says nothing of its content (none at all, as Python `requests` with `data=` or httpx with `content=`
    send it, or `application/octet-stream`, as aiohttp sends bytes) is parsed as JSON when it starts with `{`, and
    is one text otherwise. A leading UTF-8 byte-order mark is dropped first. A JSON envelope is never embedded as
    text, and a JSON string is never read as one: it is the JSON value it is.
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
    elif isinstance(value, str) and content_type != TORCHSERVE_PARSES:  # a text/* body TorchServe decoded
        text = value
    else:  # the JSON value TorchServe parsed from an application/json body: a string is that string, not a body
        return value
    text = text.removeprefix(BOM)  # a byte-order mark says how the body is encoded; it is not content
    media = (content_type or "").split(";", 1)[0].strip().lower()
    sniffed = media in UNTYPED and text.lstrip()[:1] == "{"
    if not (media.endswith("/json") or media.endswith("+json") or sniffed):
        return Text(text)
    try:
        return json.loads(text)
    except ValueError as e:  # JSONDecodeError, or an integer too long to convert
        if not isinstance(e, json.JSONDecodeError):
            raise bad(
                "InvalidJSON",
                f"the body is not valid JSON here: it holds an integer of more than "
                f"{sys.get_int_max_str_digits()} digits",
            ) from None
        sent = f"the Content-Type {media} says nothing of the content" if media else "no Content-Type was sent"
        hint = (
            f" ({sent} and the body starts with '{{', so it was read as JSON; "
            "send Content-Type: text/plain to embed it as text)"
            if sniffed
            else ""
        )
        where = f"at line {e.lineno} column {e.colno}"
        raise bad("InvalidJSON", f"the body is not valid JSON: {e.msg} {where}{hint}") from None
