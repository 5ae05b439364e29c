"""KServe v2 (Open Inference Protocol) at `/v2/models/NAME/infer`: one BYTES input tensor of texts.

Request: `{"id"?, "parameters"?, "inputs": [{"name", "datatype": "BYTES", "shape": [n] or [n, 1], "data"}],
"outputs"?}`; other fields (`model_name`, `model_version`, input `parameters`, ...) are tolerated. The shape is
checked (rank, then each dimension against max_texts_per_request) before any arithmetic on it.
Answer: `{"id"?, "model_name", "outputs": [...]}`, one tensor per answer field: `embedding` FP32 [n, dim] (with
the parameter `precision` "binary" INT8 [n, ceil(dim / 8)], "ubinary" UINT8: sign bits packed, as
sentence-transformers' `quantize_embeddings`);
classification `label` BYTES [n] and `scores` FP32 [n, labels] (one label: `score` FP32 [n]); `tokens` INT64 [n];
`truncated` BOOL [n]. A classifier also takes text pairs: two BYTES inputs, `text` and `text_pair`, of one shape.
`outputs` in the request selects among them. The request's `parameters` may carry `prompt_name` or `prompt`,
`normalize`, `dimensions`, `precision` and `raw_scores`, as in our JSON.

The binary tensor data extension, as KServe's and Triton's clients send it: the request's JSON is the first
`Inference-Header-Content-Length` bytes of the body, and an input with `parameters.binary_data_size` carries its
data after it (BYTES: each element a little-endian uint32 length, then its bytes). Outputs come back binary when
asked (`parameters.binary_data_output`, or an output's `parameters.binary_data`): their `data` is replaced by
`parameters.binary_data_size` and their bytes follow the JSON, whose length is then the response's
`Inference-Header-Content-Length`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bucketing.answers import Answer, Options
from bucketing.model_kinds import ONE_PER_INPUT, KindName, answer_fields
from bucketing.protocols.base import (
    Binary,
    Limits,
    Pair,
    Wire,
    bad,
    check_count,
    is_int,
    json_type,
    names,
    quote,
)
from bucketing.protocols.base import error_body as error_body
from bucketing.protocols.inputs import pairs, texts, too_many
from bucketing.protocols.options import chunked, late_refused, read_options
from bucketing.protocols.outputs import asked_by_tensors, ragged_sparse, ragged_vectors, takes_outputs, v2_tensors
from bucketing.quantize import PRECISIONS

NAME = "kserve-v2"
ANSWERS: tuple[KindName, ...] | None = ONE_PER_INPUT  # not a multi-vector model
SERVED = "POST /v2/models/NAME/infer (KServe v2, one BYTES input of texts; a classifier: text and text_pair)"
ROUTES: dict[str, Any] = {}  # reached at the plain predictions path; its body is claimed (`claims`)
MAX_RANK = 2  # [n] or [n, 1]
MAX_ID_CHARS = 1024  # a request id is echoed back; longer is a client's mistake, not an answer too large
HEADER_LENGTH = "inference-header-content-length"
BINARY_TYPES = {"FP32": "<f4", "INT64": "<i8", "BOOL": "?", "INT8": "<i1", "UINT8": "<u1"}


@dataclass(frozen=True)
class V2Request:
    inputs: tuple[str, ...] | tuple[Pair, ...]
    id: str | None = None
    outputs: tuple[str, ...] | None = None  # the outputs asked for, in the request's order (None: all)
    binary: frozenset[str] = frozenset()  # outputs to send as binary data
    options: Options = Options()  # from the request's `parameters`: prompt_name, prompt, normalize, dimensions

    def where(self, index: int) -> str:
        return f"inputs[0].data[{index}]" if not isinstance(self.inputs[index], Pair) else f"pair {index}"

    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        vectors = PRECISIONS[self.options.precision].v2_datatype
        tensors = outputs([a.fields(self.options) for a in answers], vectors)
        if self.outputs is not None:
            by_name = {t["name"]: t for t in tensors}
            tensors = [by_name[name] for name in self.outputs]
        body: dict[str, Any] = {"model_name": model_name, "outputs": tensors}
        if self.id is not None:
            body = {"id": self.id, **body}
        if not self.binary & {t["name"] for t in tensors}:
            return body
        chunks = []
        for tensor in tensors:
            if tensor["name"] in self.binary:
                chunk = encode(tensor["datatype"], tensor.pop("data"))
                tensor["parameters"] = {**tensor.get("parameters", {}), "binary_data_size": len(chunk)}
                chunks.append(chunk)
        return Binary(body, tuple(chunks))


def claims(body: Any) -> bool:
    """Whether a body at the plain predictions path is a v2 request."""
    return isinstance(body, Mapping) and "inputs" in body


def outputs(rows: Sequence[dict[str, Any]], vectors: str = "FP32") -> list[dict[str, Any]]:
    """Per-input answer fields as v2 tensors, one per field (`vectors`: the datatype of a vector's values, as the
    request's precision says); a field of another type is a server error."""
    tensors: list[dict[str, Any]] = []
    n = len(rows)
    for name, first in rows[0].items():
        column = [r[name] for r in rows]
        if isinstance(first, bool):
            tensors.append({"name": name, "datatype": "BOOL", "shape": [n], "data": column})
        elif isinstance(first, int):
            tensors.append({"name": name, "datatype": "INT64", "shape": [n], "data": column})
        elif isinstance(first, float):  # a one-label classifier's score
            tensors.append({"name": name, "datatype": "FP32", "shape": [n], "data": column})
        elif isinstance(first, str):
            tensors.append({"name": name, "datatype": "BYTES", "shape": [n], "data": column})
        elif (isinstance(first, np.ndarray) and first.ndim == 2) or (
            isinstance(first, list) and any(row and isinstance(row[0], list) for row in column)
        ):
            tensors += ragged_vectors(name, column)  # vectors per input (multi-vector, BGE-M3's colbert)
        elif isinstance(first, dict) and "indices" in first and "values" in first:
            tensors += ragged_sparse(name, column)  # a sparse vector per input (BGE-M3's sparse)
        elif isinstance(first, list):
            flat = [x for row in column for x in row]
            tensors.append({"name": name, "datatype": vectors, "shape": [n, len(first)], "data": flat})
        elif isinstance(first, dict):  # scores by label: a [n, labels] tensor in the first row's key order
            keys = list(first)
            flat = [row[k] for row in column for k in keys]
            tensors.append(
                {
                    "name": name,
                    "datatype": "FP32",
                    "shape": [n, len(keys)],
                    "data": flat,
                    "parameters": {"labels": keys},
                }
            )
        else:
            raise TypeError(f"answer field {name!r} of type {type(first).__name__} has no v2 datatype")
    return tensors


def encode(datatype: str, data: list[Any] | np.ndarray) -> bytes:
    """A tensor's data (a list, or an array kept whole) in the binary extension's layout (little-endian; BYTES
    length-prefixed)."""
    if datatype == "BYTES":
        items = [str(x).encode("utf-8") for x in data]
        return b"".join(struct.pack("<I", len(b)) + b for b in items)
    return np.asarray(data, dtype=BINARY_TYPES[datatype]).tobytes()


def decode_bytes(raw: bytes, max_items: int, t: str = "inputs[0]") -> list[str]:
    """BYTES elements from binary data: a uint32 length, then that many bytes of UTF-8, each."""
    items: list[str] = []
    offset = 0
    while offset < len(raw):
        if len(items) >= max_items:
            raise too_many(None, f"{t}.data", max_items)
        if offset + 4 > len(raw):
            raise bad("InvalidRequest", f"{t} binary data ends inside the length of element {len(items)}")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise bad(
                "InvalidRequest", f"{t} binary element {len(items)} claims {length} bytes; {len(raw) - offset} are left"
            )
        try:
            items.append(raw[offset : offset + length].decode("utf-8"))
        except UnicodeDecodeError as e:
            raise bad("InvalidEncoding", f"{t} binary element {len(items)} is not UTF-8 (byte {e.start})") from None
        offset += length
    return items


def split_binary(body: bytes, header_length: str) -> tuple[Any, bytes]:
    """The binary extension's body: its JSON header (decoded) and the binary data after it."""
    if not header_length.strip().isdigit() or not 0 < int(header_length) <= len(body):
        raise bad(
            "InvalidRequest",
            f"Inference-Header-Content-Length {quote(header_length, 40)} must be a "
            f"length from 1 to the body's {len(body)} bytes",
        )
    n = int(header_length)
    try:
        return json.loads(body[:n].decode("utf-8")), body[n:]
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(
            "InvalidJSON",
            f"the first {n} bytes (Inference-Header-Content-Length) are not a JSON object ({type(e).__name__})",
        ) from None


def parse(body: Any, limits: Limits, binary: bytes | None = None) -> V2Request:
    """A v2 request from its JSON (and, with the binary extension, the bytes after it); raises the client's
    mistake."""
    if not isinstance(body, Mapping) or "inputs" not in body:
        raise bad("InvalidRequest", f'expected a JSON object with "inputs", got a JSON {json_type(body)}')
    if limits.kind.sparse:
        raise bad(
            "InvalidRequest",
            f"KServe v2 answers dense tensors; this is {limits.kind.a_model}, answered as indices and values at "
            "POST /predictions/NAME (native or KServe v1), v1/embeddings (OpenAI) or .../embed_sparse (TEI)",
        )
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise bad("InvalidType", f'"id" must be a string, got {json_type(request_id)}', "id")
    if request_id is not None and len(request_id) > MAX_ID_CHARS:
        raise bad(
            "InvalidRequest",
            f'"id" has {len(request_id)} characters; at most {MAX_ID_CHARS} (it is echoed in the answer)',
            "id",
        )
    inputs = body["inputs"]
    if not isinstance(inputs, list) or not 1 <= len(inputs) <= 2 or not all(isinstance(i, Mapping) for i in inputs):
        raise bad(
            "InvalidRequest",
            '"inputs" must be a list of exactly one tensor object (the texts), or for a '
            'classifier two, "text" and "text_pair"',
            "inputs",
        )
    if len(inputs) == 2 and sorted(str(i.get("name")) for i in inputs) != ["text", "text_pair"]:
        raise bad("InvalidRequest", 'two inputs must be named "text" and "text_pair" (text pairs)', "inputs")
    starts = _binary_starts(inputs, binary) if binary is not None and len(inputs) == 2 else None
    columns = []
    for tensor in sorted(inputs, key=lambda i: i.get("name") == "text_pair"):
        k = inputs.index(tensor)
        size, mine = _binary_size(tensor), binary
        if binary is not None and starts is not None and size is not None:  # each input's bytes in order, as sent
            mine = binary[starts[k] : starts[k] + size]
        columns.append(_column(tensor, mine, limits, f"inputs[{k}]"))
    if len(columns) == 2:
        if len(columns[0]) != len(columns[1]):
            raise bad(
                "InvalidRequest",
                f'"text" has {len(columns[0])} items but "text_pair" {len(columns[1])}; one pair per row',
                "inputs",
            )
        parsed: tuple[Any, ...] = pairs([list(p) for p in zip(*columns)], "inputs", limits)
    else:
        parsed = columns[0]
    given = body.get("parameters")
    parameters: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    late = late_refused(parameters, "KServe v2")
    if late:
        raise bad("InvalidRequest", late[1], late[0])
    options = read_options(parameters, limits)
    known = answer_fields(limits.task, limits.dimensions)
    if takes_outputs(limits.kind):  # a BGE-M3 model: each output's tensors
        known = (*v2_tensors(), *known[1:])
    if chunked(options, limits):  # each answer then counts its windows, before `truncated` (`Answer.fields`)
        known = (*known[:-1], "chunks", known[-1])
    selection = _outputs(body, known)
    if selection[0] is not None and takes_outputs(limits.kind):  # the outputs its named tensors hold
        options = asked_by_tensors(options, selection[0])
    return V2Request(parsed, request_id, *selection, options)


def _column(tensor: Mapping[str, Any], binary: bytes | None, limits: Limits, t: str) -> tuple[str, ...]:
    """One BYTES tensor's texts: its datatype, its shape (checked before anything is computed from it), its data."""
    if tensor.get("datatype") != "BYTES":
        raise bad("InvalidType", f'{t}.datatype must be "BYTES", got {quote(tensor.get("datatype"))}')
    shape = _shape(tensor.get("shape"), limits.max_texts, t)
    data = _data(tensor, binary, limits.max_texts, t)
    items = shape[0] * (shape[1] if len(shape) == 2 else 1)
    if isinstance(data, list) and items != len(data):
        raise bad("InvalidRequest", f"{t}.shape {shape} holds {items} items but data has {len(data)}")
    return texts(data, f"{t}.data", limits.max_texts)


def _binary_size(tensor: Mapping[str, Any]) -> int | None:
    """A tensor's `parameters.binary_data_size`, when it is an integer."""
    parameters = tensor.get("parameters")
    size = parameters.get("binary_data_size") if isinstance(parameters, Mapping) else None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _binary_starts(inputs: Sequence[Mapping[str, Any]], binary: bytes) -> list[int]:
    """Where each input's bytes start in the binary part: after those of the inputs sent before it that carry
    `binary_data_size` (either input may be the binary one, or both); the sizes must add up to the part's length."""
    starts, total = [], 0
    for k, tensor in enumerate(inputs):
        starts.append(total)
        parameters = tensor.get("parameters")
        if not isinstance(parameters, Mapping) or "binary_data_size" not in parameters:
            continue
        size = _binary_size(tensor)
        if size is None or size < 0:
            raise bad(
                "InvalidRequest",
                f"inputs[{k}].parameters.binary_data_size must be a byte count, got "
                f"{quote(parameters['binary_data_size'], 40)}",
            )
        total += size
    if total != len(binary):
        raise bad(
            "InvalidRequest",
            f"the inputs' binary_data_size add up to {total} but {len(binary)} bytes follow the JSON",
        )
    return starts


def _data(tensor: Mapping[str, Any], binary: bytes | None, max_texts: int, t: str = "inputs[0]") -> Any:
    parameters = tensor.get("parameters")
    size = parameters.get("binary_data_size") if isinstance(parameters, Mapping) else None
    if size is None:
        data = tensor.get("data")
        if isinstance(data, list) and data and all(isinstance(row, list) for row in data):
            data = [x for row in data for x in row]  # a [n, 1] tensor given row by row
        return data
    if binary is None:
        raise bad(
            "InvalidRequest",
            f"{t} has binary_data_size but the request has no binary data "
            "(send the Inference-Header-Content-Length header)",
        )
    if not is_int(size) or size != len(binary):
        raise bad(
            "InvalidRequest",
            f"{t}.parameters.binary_data_size is {quote(size, 40)} but {len(binary)} bytes follow the JSON",
        )
    return decode_bytes(binary, max_texts, t)


def _outputs(body: Mapping[str, Any], known: tuple[str, ...]) -> tuple[tuple[str, ...] | None, frozenset[str]]:
    """Which of the `known` outputs to send (the request's `outputs`, else all) and which of them as binary data."""
    parameters = body.get("parameters")
    all_binary = isinstance(parameters, Mapping) and parameters.get("binary_data_output") is True
    requested = body.get("outputs")
    if requested is None:
        return None, frozenset(known if all_binary else ())
    if not isinstance(requested, list) or not all(isinstance(o, Mapping) and "name" in o for o in requested):
        raise bad("InvalidRequest", '"outputs" must be a list of objects with a "name"', "outputs")
    unknown = [str(o["name"]) for o in requested if o["name"] not in known]
    twice = sorted({str(o["name"]) for o in requested if [r["name"] for r in requested].count(o["name"]) > 1})
    if twice and not unknown:
        raise bad("InvalidRequest", f"output(s) {names(twice)} asked for more than once", "outputs")
    if unknown:
        raise bad("InvalidRequest", f"unknown output(s) {names(unknown)}; this model has {', '.join(known)}", "outputs")
    binary = set()
    for o in requested:
        flag = o.get("parameters", {}).get("binary_data") if isinstance(o.get("parameters"), Mapping) else None
        if flag is True or (flag is None and all_binary):
            binary.add(o["name"])
    return tuple(o["name"] for o in requested), frozenset(binary)


def _shape(shape: Any, max_texts: int, t: str = "inputs[0]") -> list[int]:
    """[n] or [n, 1] with n <= max_texts, checked dimension by dimension before any product."""
    if not isinstance(shape, list) or not shape or len(shape) > MAX_RANK:
        raise bad(
            "InvalidType",
            f"{t}.shape must be a list of 1 or 2 integers ([n] or [n, 1]), got "
            f"{json_type(shape) if not isinstance(shape, list) else f'{len(shape)} dimensions'}",
        )
    for i, d in enumerate(shape):
        if not is_int(d) or d < 0:
            raise bad("InvalidType", f"{t}.shape[{i}] must be a non-negative integer, got {quote(d, 40)}")
    if shape[0] > max_texts:
        raise too_many(shape[0], f"{t}.data", max_texts)
    if len(shape) == 2 and shape[1] != 1:
        raise bad("InvalidRequest", f"{t}.shape {quote(shape, 60)}: one text per row ([n, 1]) is expected")
    return shape


WIRE = Wire(
    name=NAME,
    routes=ROUTES,
    answers=ANSWERS,
    served=SERVED,
    error_body=error_body,
    claims=claims,
    claimed=parse,
)
