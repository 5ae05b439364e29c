"""KServe v2 (Open Inference Protocol) at `/v2/models/NAME/infer`: one BYTES input tensor of texts.

Request: `{"id"?, "parameters"?, "inputs": [{"name", "datatype": "BYTES", "shape": [n] or [n, 1], "data"}],
"outputs"?}`; other top-level fields (`model_name`, `model_version`, ...) are tolerated. The shape is checked
(rank, then each dimension against max_texts_per_request) before any arithmetic on it.
Answer: `{"id"?, "model_name", "outputs": [...]}`, one tensor per answer field: `embedding` FP32 [n, dim];
classification `label` BYTES [n] and `scores` FP32 [n, labels]; `tokens` INT64 [n]; `truncated` BOOL [n].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .base import Answer, Limits, RequestError, bad, check_count, is_int, json_type, quote, texts, too_many
from .base import error_body as error_body

NAME = "kserve-v2"
MAX_RANK = 2  # [n] or [n, 1]


@dataclass(frozen=True)
class V2Request:
    inputs: tuple[str, ...]
    id: str | None = None

    def where(self, index: int) -> str:
        return f"inputs[0].data[{index}]"

    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        body: dict[str, Any] = {"model_name": model_name, "outputs": outputs([a.fields() for a in answers])}
        return body if self.id is None else {"id": self.id, **body}


def claims(body: Any) -> bool:
    """Whether a body at the plain predictions path is a v2 request."""
    return isinstance(body, Mapping) and "inputs" in body


def outputs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-input answer fields as v2 tensors, one per field; a field of another type is a server error."""
    tensors = []
    n = len(rows)
    for name, first in rows[0].items():
        column = [r[name] for r in rows]
        if isinstance(first, bool):
            tensors.append({"name": name, "datatype": "BOOL", "shape": [n], "data": column})
        elif isinstance(first, int):
            tensors.append({"name": name, "datatype": "INT64", "shape": [n], "data": column})
        elif isinstance(first, str):
            tensors.append({"name": name, "datatype": "BYTES", "shape": [n], "data": column})
        elif isinstance(first, list):
            flat = [x for row in column for x in row]
            tensors.append({"name": name, "datatype": "FP32", "shape": [n, len(first)], "data": flat})
        elif isinstance(first, dict):  # scores by label: a [n, labels] tensor in the first row's key order
            keys = list(first)
            flat = [row[k] for row in column for k in keys]
            tensors.append({"name": name, "datatype": "FP32", "shape": [n, len(keys)], "data": flat,
                            "parameters": {"labels": keys}})  # fmt: skip
        else:
            raise TypeError(f"answer field {name!r} of type {type(first).__name__} has no v2 datatype")
    return tensors


def parse(body: Any, limits: Limits) -> V2Request | RequestError:
    if not isinstance(body, Mapping) or "inputs" not in body:
        return bad("InvalidRequest", f'expected a JSON object with "inputs", got a JSON {json_type(body)}')
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        return bad("InvalidType", f'"id" must be a string, got {json_type(request_id)}', "id")
    inputs = body["inputs"]
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], Mapping):
        return bad("InvalidRequest", '"inputs" must be a list of exactly one tensor object (the texts)', "inputs")
    tensor = inputs[0]
    if tensor.get("datatype") != "BYTES":
        return bad("InvalidType", f'inputs[0].datatype must be "BYTES", got {quote(tensor.get("datatype"))}')
    shape = _shape(tensor.get("shape"), limits.max_texts)
    if isinstance(shape, RequestError):
        return shape
    data = tensor.get("data")
    if isinstance(data, list) and data and all(isinstance(row, list) for row in data):
        data = [x for row in data for x in row]  # a [n, 1] tensor given row by row
    items = shape[0] * (shape[1] if len(shape) == 2 else 1)
    if isinstance(data, list) and items != len(data):
        return bad("InvalidRequest", f"inputs[0].shape {shape} holds {items} items but data has {len(data)}")
    parsed = texts(data, "inputs[0].data", limits.max_texts)
    return parsed if isinstance(parsed, RequestError) else V2Request(parsed, request_id)


def _shape(shape: Any, max_texts: int) -> list[int] | RequestError:
    """[n] or [n, 1] with n <= max_texts, checked dimension by dimension before any product."""
    if not isinstance(shape, list) or not shape or len(shape) > MAX_RANK:
        return bad(
            "InvalidType",
            f"inputs[0].shape must be a list of 1 or 2 integers ([n] or [n, 1]), got "
            f"{json_type(shape) if not isinstance(shape, list) else f'{len(shape)} dimensions'}",
        )
    for i, d in enumerate(shape):
        if not is_int(d) or d < 0:
            return bad("InvalidType", f"inputs[0].shape[{i}] must be a non-negative integer, got {quote(d, 40)}")
    if shape[0] > max_texts:
        return too_many(shape[0], "inputs[0].data", max_texts)
    if len(shape) == 2 and shape[1] != 1:
        return bad("InvalidRequest", f"inputs[0].shape {quote(shape, 60)}: one text per row ([n, 1]) is expected")
    return shape
