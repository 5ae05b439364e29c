"""Wire formats, one module each, behind one interface; `parse` picks the format of each request.

A wire format is a module with `NAME`, `parse(body, limits) -> Request | RequestError` and
`error_body(error)`. The format comes from TorchServe's `url_path` (what follows `/predictions/NAME/VERSION/`)
and, at the plain predictions path, from the body: `inputs` is KServe v2, `instances` KServe v1, anything else
ours. Each request then carries its own outcome (`Incoming`): a request to run, or the error to answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from . import kserve_v1, kserve_v2, native, openai
from .base import Answer, Binary, Limits, Meta, Request, RequestError, decode, quote

WIRES: tuple[ModuleType, ...] = (native, kserve_v1, kserve_v2, openai)
Parser = Callable[[Any, Limits], Any]

# url_path -> (wire format, its parser); "" is the plain predictions path, where the body decides.
ROUTES: dict[str, tuple[ModuleType, Parser]] = {
    openai.EMBEDDINGS: (openai, openai.parse),
    openai.MODELS: (openai, openai.parse_models),
}
SERVED = (
    'POST /predictions/NAME[/VERSION] (JSON {"text"} or {"texts"}, text/plain, KServe v1/v2 bodies), '
    f"POST /predictions/NAME/VERSION/{openai.EMBEDDINGS} (OpenAI, embedding models), "
    f"GET /predictions/NAME/VERSION/{openai.MODELS}"
)


@dataclass(frozen=True)
class Reply:
    """One request's HTTP answer: status, body, its content type and extra headers (and the error type, if any)."""

    status: int
    body: str | bytes
    error: str | None = None
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Incoming:
    """One request: its wire format, and either the request to run or the error it is answered with."""

    wire: ModuleType
    outcome: Request | RequestError

    @property
    def request(self) -> Request | None:
        return None if isinstance(self.outcome, RequestError) else self.outcome

    def fail(self, error: RequestError) -> Incoming:
        return replace(self, outcome=error)

    def reply(self, answers: Sequence[Answer], model_name: str, max_bytes: int) -> Reply:
        """Render the answer (or the error) in this request's own format; an answer over max_bytes is a 413."""
        if isinstance(self.outcome, RequestError):
            return self._error(self.outcome)
        rendered = self.outcome.render(answers, model_name)
        body, reply = (json.dumps(rendered), Reply(200, "")) if not isinstance(rendered, Binary) else _binary(rendered)
        if len(body) > max_bytes:
            return self._error(
                RequestError(
                    413,
                    "ResponseTooLarge",
                    f"the answer would be {len(body)} bytes, over the {max_bytes} bytes a response may have "
                    "(handler.max_response_bytes, TorchServe's max_response_size); send fewer texts per request",
                )
            )
        return replace(reply, body=body)

    def _error(self, error: RequestError) -> Reply:
        return Reply(error.status, json.dumps(self.wire.error_body(error)), error.type)


def _binary(rendered: Binary) -> tuple[bytes, Reply]:
    header = json.dumps(rendered.header).encode()
    headers = (("Inference-Header-Content-Length", str(len(header))),)
    return header + b"".join(rendered.chunks), Reply(200, b"", content_type="application/octet-stream", headers=headers)


def parse(row: Any, meta: Meta, limits: Limits) -> Incoming:
    """One TorchServe request row to its wire format and outcome; never raises."""
    content_type = meta.content_type
    path = (meta.url_path or "").strip("/")
    if path and path not in ROUTES:
        wire = openai if path.startswith("v1/") else native
        return Incoming(wire, RequestError(404, "NotFound", f"no endpoint {quote(path, 60)} here; served: {SERVED}"))
    wire, parser = ROUTES.get(path, (native, native.parse))
    try:
        header_length = meta.header(kserve_v2.HEADER_LENGTH)
        if not path and header_length is not None and isinstance(row, dict):
            return _binary_request(row, header_length, limits)
        body = decode(row, content_type)
        if isinstance(body, RequestError):
            return Incoming(wire, body)
        if not path:
            wire, parser = _by_body(body)
        return Incoming(wire, parser(body, limits))
    except RecursionError:
        return Incoming(wire, RequestError(400, "InvalidJSON", "the body nests too deeply"))
    except Exception as e:  # noqa: BLE001 - whatever a client sends is answered, never raised
        error = RequestError(400, "InvalidRequest", f"the request could not be read ({type(e).__name__})")
        return Incoming(wire, error)


def _binary_request(row: dict[str, Any], header_length: str, limits: Limits) -> Incoming:
    """A v2 request in the binary data extension: JSON, then raw tensor bytes."""
    value = next((row[k] for k in ("body", "data") if k in row), None)
    if not isinstance(value, (bytes, bytearray)):  # TorchServe decoded it: plain JSON, no binary part
        return Incoming(kserve_v2, kserve_v2.parse(value, limits))
    split = kserve_v2.split_binary(bytes(value), header_length)
    if isinstance(split, RequestError):
        return Incoming(kserve_v2, split)
    return Incoming(kserve_v2, kserve_v2.parse(split[0], limits, split[1]))


def _by_body(body: Any) -> tuple[ModuleType, Parser]:
    for wire in (kserve_v2, kserve_v1):
        if wire.claims(body):
            return wire, wire.parse
    return native, native.parse


FLOAT_CHARS = 26  # the longest float32 as JSON writes it ("-1.2345678901234567e-05"), and ", "
ANSWER_OVERHEAD = 200  # field names, token count, OpenAI's per-embedding object, per input


def largest_answer(limits: Limits, labels: Sequence[str] | None = None) -> int:
    """An upper bound on the bytes of one answer to a request of max_texts inputs, in any wire format."""
    if labels is None:
        per_input = limits.dimensions * FLOAT_CHARS
    else:  # scores by label, and v2's label list; then the top label
        per_input = sum(2 * (len(json.dumps(label)) + 2) + FLOAT_CHARS for label in labels)
        per_input += max((len(json.dumps(label)) for label in labels), default=0)
    return limits.max_texts * (per_input + ANSWER_OVERHEAD) + ANSWER_OVERHEAD
