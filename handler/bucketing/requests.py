"""Request parsing (pure): one TorchServe request row to texts, or a client error naming what was wrong.

Accepted bodies:
- `text/plain`: the body is one text; answered with one object;
- JSON `{"text": "..."}`: one text; answered with one object;
- JSON `{"texts": ["...", ...]}`: a client-side list; answered with a list, in the same order;
- KServe v1 `{"instances": [...]}` and v2 `{"inputs": [{"datatype": "BYTES", ...}]}` (see V1Request, V2Request).
"""

from __future__ import annotations

import json
import math
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
    """Our own protocol: a text/plain body, `{"text": ...}` (one object back) or `{"texts": [...]}` (a list)."""

    texts: tuple[str, ...]
    single: bool

    def render(self, results: Sequence[Any], model_name: str = "") -> Any:
        """The answer body: one object for a single text, a list for `texts`."""
        _check_count(self.texts, results)
        return results[0] if self.single else list(results)

    def where(self, index: int) -> str:
        return "the text" if self.single else f"texts[{index}]"


@dataclass(frozen=True)
class V1Request:
    """KServe v1: `{"instances": ["...", {"text": "..."}]}`, answered `{"predictions": [...]}`."""

    texts: tuple[str, ...]

    def render(self, results: Sequence[Any], model_name: str = "") -> Any:
        _check_count(self.texts, results)
        return {"predictions": list(results)}

    def where(self, index: int) -> str:
        return f"instances[{index}]"


@dataclass(frozen=True)
class V2Request:
    """KServe v2 (open inference protocol): one BYTES input of texts, answered with one tensor per field."""

    texts: tuple[str, ...]
    id: str | None = None

    def render(self, results: Sequence[Any], model_name: str = "") -> Any:
        _check_count(self.texts, results)
        body: dict[str, Any] = {"model_name": model_name, "outputs": v2_outputs(results)}
        if self.id is not None:
            body = {"id": self.id, **body}
        return body

    def where(self, index: int) -> str:
        return f"inputs[0].data[{index}]"


Request = TextRequest | V1Request | V2Request
Parsed = Request | RequestError


def _check_count(texts: Sequence[str], results: Sequence[Any]) -> None:
    if len(results) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(results)} results")


def v2_outputs(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-text answer dicts as v2 tensors, one per field: floats to FP32, str to BYTES, bool to BOOL, int to INT64."""
    outputs = []
    for name, first in results[0].items():
        column = [r[name] for r in results]
        if isinstance(first, bool):
            outputs.append({"name": name, "datatype": "BOOL", "shape": [len(column)], "data": column})
        elif isinstance(first, int):
            outputs.append({"name": name, "datatype": "INT64", "shape": [len(column)], "data": column})
        elif isinstance(first, str):
            outputs.append({"name": name, "datatype": "BYTES", "shape": [len(column)], "data": column})
        elif isinstance(first, list):
            flat = [x for row in column for x in row]
            outputs.append({"name": name, "datatype": "FP32", "shape": [len(column), len(first)], "data": flat})
        elif isinstance(first, dict):  # e.g. scores by label: a [n, labels] tensor in the first row's key order
            keys = list(first)
            flat = [row[k] for row in column for k in keys]
            outputs.append({"name": name, "datatype": "FP32", "shape": [len(column), len(keys)], "data": flat,
                            "parameters": {"labels": keys}})  # fmt: skip
    return outputs


def parse_request(row: Mapping[str, Any], content_type: str | None, max_texts: int) -> Parsed:
    """Parse one request row as TorchServe delivers it (`{"body": ...}` or `{"data": ...}`); never raises."""
    try:
        return _parse_row(row, content_type, max_texts)
    except RecursionError:
        return _bad("InvalidJSON", "the body nests too deeply")
    except Exception as e:  # noqa: BLE001 - whatever a client sends is answered, never raised
        return _bad("InvalidRequest", f"the request could not be read ({type(e).__name__})")


def _parse_row(row: Mapping[str, Any], content_type: str | None, max_texts: int) -> Parsed:
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
    if "inputs" in keys:
        return _v2(obj, max_texts)
    if "instances" in keys:
        return _v1(obj, max_texts)
    if not keys:
        return _bad("InvalidRequest", 'the JSON object is empty; expected {"text": ...} or {"texts": [...]}')
    unknown = sorted(keys - {"text", "texts"})
    if unknown:
        return _bad("InvalidRequest", f'unknown field(s) {", ".join(map(repr, unknown))}; expected "text" or "texts"')
    return _bad("InvalidRequest", 'send either "text" or "texts", not both')


def _v1(obj: Mapping[str, Any], max_texts: int) -> Parsed:
    instances = obj["instances"]
    if not isinstance(instances, list):
        return _bad("InvalidType", f'"instances" must be a list, got {_json_type(instances)}')
    texts = [i["text"] if isinstance(i, Mapping) and set(i) == {"text"} else i for i in instances]
    parsed = _texts(texts, "instances", max_texts)
    return parsed if isinstance(parsed, RequestError) else V1Request(parsed)


def _v2(obj: Mapping[str, Any], max_texts: int) -> Parsed:
    unknown = sorted(set(obj) - {"id", "inputs", "outputs", "parameters"})
    if unknown:
        return _bad("InvalidRequest", f"unknown field(s) {', '.join(map(repr, unknown))} in a v2 inference request")
    request_id = obj.get("id")
    if request_id is not None and not isinstance(request_id, str):
        return _bad("InvalidType", f'"id" must be a string, got {_json_type(request_id)}')
    inputs = obj["inputs"]
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], Mapping):
        return _bad("InvalidRequest", '"inputs" must be a list of exactly one tensor object (the texts)')
    tensor = inputs[0]
    if tensor.get("datatype") != "BYTES":
        return _bad("InvalidType", f'inputs[0].datatype must be "BYTES", got {tensor.get("datatype")!r}')
    data, shape = tensor.get("data"), tensor.get("shape")
    if isinstance(data, list) and data and all(isinstance(row, list) for row in data):
        data = [x for row in data for x in row]  # a [n, 1] tensor given row by row
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        return _bad("InvalidType", f"inputs[0].shape must be a list of integers, got {_json_type(shape)}")
    if isinstance(data, list) and math.prod(shape) != len(data):
        return _bad(
            "InvalidRequest", f"inputs[0].shape {shape} holds {math.prod(shape)} items but data has {len(data)}"
        )
    parsed = _texts(data, "inputs[0].data", max_texts)
    return parsed if isinstance(parsed, RequestError) else V2Request(parsed, request_id)


def _many(texts: Any, max_texts: int) -> Parsed:
    parsed = _texts(texts, "texts", max_texts)
    return parsed if isinstance(parsed, RequestError) else TextRequest(parsed, single=False)


def _texts(texts: Any, where: str, max_texts: int) -> tuple[str, ...] | RequestError:
    """A non-empty list of at most max_texts non-empty strings; errors name `where` and the index."""
    if not isinstance(texts, list):
        return _bad("InvalidType", f'"{where}" must be a list of strings, got {_json_type(texts)}')
    if not texts:
        return _bad("EmptyText", f'"{where}" is an empty list')
    if len(texts) > max_texts:
        return RequestError(413, "TooManyTexts", f'"{where}" has {len(texts)} items; at most {max_texts} per request')
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            return _bad("InvalidType", f"{where}[{i}] must be a string, got {_json_type(t)}")
        error = _check_text(t, f"{where}[{i}]")
        if error:
            return error
    return tuple(texts)


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
