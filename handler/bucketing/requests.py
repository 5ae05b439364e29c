"""Request parsing (pure): one TorchServe request row to texts, or a client error naming what was wrong.

Accepted bodies:
- `text/plain`: the body is one text; answered with one object;
- JSON `{"text": "..."}`: one text; answered with one object;
- JSON `{"texts": ["...", ...]}`: a client-side list; answered with a list, in the same order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BODY_KEYS = ("body", "data")


@dataclass(frozen=True)
class RequestError:
    """A client mistake: answered with `status` and a JSON body, for this request alone."""

    status: int
    type: str
    message: str

    def body(self) -> dict[str, Any]:
        return {"code": self.status, "type": self.type, "message": self.message}


@dataclass(frozen=True)
class TextRequest:
    """The texts of one request, and how to shape its answer."""

    texts: tuple[str, ...]
    single: bool

    def render(self, results: Sequence[Any]) -> Any:
        """The answer body: one object for a single text, a list for `texts`."""
        if len(results) != len(self.texts):
            raise ValueError(f"{len(self.texts)} texts but {len(results)} results")
        return results[0] if self.single else list(results)


Parsed = TextRequest | RequestError


def parse_request(row: Mapping[str, Any], content_type: str | None, max_texts: int) -> Parsed:
    """Parse one request row as TorchServe delivers it (`{"body": ...}` or `{"data": ...}`)."""
    if not isinstance(row, Mapping):
        return _bad("InvalidRequest", f"unexpected request shape {type(row).__name__}")
    key = next((k for k in BODY_KEYS if k in row), None)
    if key is None:
        if row or "form" in (content_type or "").lower():
            return RequestError(
                415,
                "UnsupportedMediaType",
                "the body arrived as form fields (curl without -H 'Content-Type: ...' sends "
                "application/x-www-form-urlencoded); send it as text/plain or application/json",
            )
        return _bad("EmptyBody", 'the request has no body; send a text or JSON {"text": ...}')
    return parse_value(row[key], content_type, max_texts)


def parse_value(value: Any, content_type: str | None, max_texts: int) -> Parsed:
    """Parse a body value: bytes, or what TorchServe already decoded (str for text/*, JSON for json)."""
    if isinstance(value, (bytes, bytearray)):
        if not value:
            return _bad("EmptyBody", "the request body is empty")
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            return _bad("InvalidEncoding", f"the body is not valid UTF-8 (byte {e.start}: {e.reason})")
        if _is_json(content_type):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                return _bad("InvalidJSON", f"the body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
        else:
            value = text
    if isinstance(value, str):
        return _single(value, "the body")
    if isinstance(value, Mapping):
        return _from_object(value, max_texts)
    return _bad(
        "InvalidRequest",
        f'expected a JSON object {{"text": ...}} or {{"texts": [...]}}, got a JSON {_json_type(value)}',
    )


def _from_object(obj: Mapping[str, Any], max_texts: int) -> Parsed:
    keys = set(obj)
    if keys == {"text"}:
        if not isinstance(obj["text"], str):
            return _bad("InvalidType", f'"text" must be a string, got {_json_type(obj["text"])}')
        return _single(obj["text"], '"text"')
    if keys == {"texts"}:
        return _many(obj["texts"], max_texts)
    if not keys:
        return _bad("InvalidRequest", 'the JSON object is empty; expected {"text": ...} or {"texts": [...]}')
    unknown = sorted(keys - {"text", "texts"})
    if unknown:
        return _bad("InvalidRequest", f'unknown field(s) {", ".join(map(repr, unknown))}; expected "text" or "texts"')
    return _bad("InvalidRequest", 'send either "text" or "texts", not both')


def _many(texts: Any, max_texts: int) -> Parsed:
    if not isinstance(texts, list):
        return _bad("InvalidType", f'"texts" must be a list of strings, got {_json_type(texts)}')
    if not texts:
        return _bad("EmptyText", '"texts" is an empty list')
    if len(texts) > max_texts:
        return RequestError(413, "TooManyTexts", f'"texts" has {len(texts)} items; at most {max_texts} per request')
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            return _bad("InvalidType", f"texts[{i}] must be a string, got {_json_type(t)}")
        error = _check_text(t, f"texts[{i}]")
        if error:
            return error
    return TextRequest(tuple(texts), single=False)


def _single(text: str, where: str) -> Parsed:
    return _check_text(text, where) or TextRequest((text,), single=True)


def _check_text(text: str, where: str) -> RequestError | None:
    if not text.strip():
        return _bad("EmptyText", f"{where} is empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return _bad("InvalidEncoding", f"{where} holds a lone surrogate at character {e.start}")
    return None


def _bad(kind: str, message: str) -> RequestError:
    return RequestError(400, kind, message)


def _is_json(content_type: str | None) -> bool:
    return bool(content_type) and "json" in content_type.lower()


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__
