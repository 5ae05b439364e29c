"""Wire formats, one `Wire` each, behind one interface; `parse` picks the format of each request.

A wire format is a `Wire` (`base.py`), declared once at the end of its module as `WIRE`, from the module's names:
- `routes`: the paths it serves after `/predictions/NAME/VERSION/` (TorchServe's `url_path`), each with its
  parser `(body, limits) -> Request`, which raises a `RequestError` (one subclass per status) for the client's
  mistake; `""` is the plain predictions path;
- `claims(body)` (optional, with `claimed`, its parser): whether a body at the plain path is its own (KServe v2:
  `inputs`; v1: `instances`);
- `answers`: the model kinds it answers (None: every kind), checked here once (`Wire.admit`) before its parser runs;
- `served`: what it serves, for the 404 that lists everything; `error_body(error)`: its error shape;
- `own_error(error)` (default: the error as raised): an error as the format types it, status included (TEI's 422
  Validation); `Wire.error_reply` answers an error through both.
Everything below is derived from `WIRES`: adding a wire format is its module (declaring its `WIRE`) and one entry
there. Each request then carries its own outcome (`Incoming`): a request to run, or the error to answer. `parse` is
where an error raised in decoding, admission or parsing becomes that outcome; the pipeline records those of its later
steps (`Incoming.fail`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from bucketing import sizes
from bucketing.answers import Answer, least_bytes
from bucketing.protocols import (
    cohere_embed,
    cohere_rerank,
    kserve_v1,
    kserve_v2,
    native,
    openai,
    tei_decode,
    tei_default,
    tei_embed,
    tei_embed_all,
    tei_embed_sparse,
    tei_info,
    tei_predict,
    tei_rerank,
    tei_similarity,
    tei_tokenize,
)
from bucketing.protocols.base import (
    Binary,
    Limits,
    Meta,
    NotFound,
    Parser,
    Request,
    RequestError,
    TooLarge,
    Wire,
    bad,
    dumps,
    quote,
)
from bucketing.protocols.base import Reply as Reply
from bucketing.protocols.body import decode
from bucketing.sizes import ANSWER_OVERHEAD, FLOAT_CHARS

# Body claims are tried in this order at the plain path; the wire that routes "" answers what none claims.
WIRES: tuple[Wire, ...] = (
    tei_default.WIRE,
    kserve_v2.WIRE,
    kserve_v1.WIRE,
    openai.WIRE,
    tei_rerank.WIRE,
    cohere_rerank.WIRE,
    cohere_embed.WIRE,
    tei_embed.WIRE,
    tei_embed_all.WIRE,
    tei_embed_sparse.WIRE,
    tei_predict.WIRE,
    tei_similarity.WIRE,
    tei_tokenize.WIRE,
    tei_decode.WIRE,
    tei_info.WIRE,
    native.WIRE,
)

ROUTES: dict[str, tuple[Wire, Parser]] = {path: (w, parser) for w in WIRES for path, parser in w.routes.items()}
SERVED = "; ".join(w.served for w in WIRES)


@dataclass(frozen=True)
class Incoming:
    """One request: its wire format, and either the request to run or the error it is answered with."""

    wire: Wire
    outcome: Request | RequestError

    @property
    def request(self) -> Request | None:
        return None if isinstance(self.outcome, RequestError) else self.outcome

    def fail(self, error: RequestError) -> Incoming:
        """This request answered with `error` (caught where it was raised)."""
        return replace(self, outcome=error.detached())

    def reply(self, answers: Sequence[Answer], model_name: str, max_bytes: int) -> Reply:
        """Render the answer (or the error) in this request's own format; an answer over max_bytes is a 413."""
        if isinstance(self.outcome, RequestError):
            return self.wire.error_reply(self.outcome)
        least = least_bytes(answers, self.outcome.options)
        if least > max_bytes:  # known from its numbers: refused before it is rendered (a multi-vector answer grew
            return self.wire.error_reply(too_large(f"at least {least}", max_bytes))  # a worker by gigabytes)
        rendered = self.outcome.render(answers, model_name)
        body, reply = (dumps(rendered), Reply(200, "")) if not isinstance(rendered, Binary) else _binary(rendered)
        if len(body) > max_bytes:
            return self.wire.error_reply(too_large(str(len(body)), max_bytes))
        return replace(reply, body=body)


def too_large(size: str, max_bytes: int) -> TooLarge:
    """An answer over the response cap: the client's 413, naming both sizes and the fix."""
    return TooLarge(
        "ResponseTooLarge",
        f"the answer would be {size} bytes, over the {max_bytes} bytes a response may have "
        "(handler.max_response_bytes, TorchServe's max_response_size); send fewer texts per request, or raise both "
        "together",
    )


def _binary(rendered: Binary) -> tuple[bytes, Reply]:
    header = dumps(rendered.header)
    headers = (("Inference-Header-Content-Length", str(len(header))),)
    return header + b"".join(rendered.chunks), Reply(200, b"", content_type="application/octet-stream", headers=headers)


def parse(row: Any, meta: Meta, limits: Limits) -> Incoming:
    """One TorchServe request row to its wire format and outcome; never raises: an error raised in decoding,
    admission or parsing is the outcome."""
    content_type = meta.content_type
    path = (meta.url_path or "").strip("/")
    if path not in ROUTES:
        return Incoming(_nearest(path), NotFound("NotFound", f"no endpoint {quote(path, 60)} here; served: {SERVED}"))
    wire, parser = ROUTES[path]
    kind = limits.kind
    try:
        header_length = meta.header(kserve_v2.HEADER_LENGTH)
        if not path and header_length is not None and isinstance(row, dict):
            wire = kserve_v2.WIRE
            wire.admit(kind)
            return Incoming(wire, _binary_request(row, header_length, limits))
        body = decode(row, content_type)
        if not path:
            wire, parser = _by_body(body)
        wire.admit(kind)
        return Incoming(wire, parser(body, limits))
    except RequestError as error:
        return Incoming(wire, error.detached())
    except RecursionError:
        return Incoming(wire, bad("InvalidJSON", "the body nests too deeply"))
    except Exception as e:  # noqa: BLE001 - whatever a client sends is answered, never raised
        return Incoming(wire, bad("InvalidRequest", f"the request could not be read ({type(e).__name__})"))


def _binary_request(row: dict[str, Any], header_length: str, limits: Limits) -> Request:
    """A v2 request in the binary data extension: JSON, then raw tensor bytes."""
    value = next((row[k] for k in ("body", "data") if k in row), None)
    if not isinstance(value, (bytes, bytearray)):  # TorchServe decoded it: plain JSON, no binary part
        return kserve_v2.parse(value, limits)
    header, binary = kserve_v2.split_binary(bytes(value), header_length)
    return kserve_v2.parse(header, limits, binary)


def _by_body(body: Any) -> tuple[Wire, Parser]:
    """The wire format that claims a body at the plain path (in `WIRES`' order), with its parser; else the plain
    path's."""
    claimed = ((w, w.claimed) for w in WIRES if w.claimed is not None and w.claims_body(body))
    return next(claimed, ROUTES[""])


def _nearest(path: str) -> Wire:
    """The wire format whose routes share the unknown path's first segment (`v1/...`: OpenAI's), for its error
    shape; else the plain path's."""
    head = path.split("/", 1)[0]
    near = [w for w in WIRES for route in w.routes if "/" in route and route.split("/", 1)[0] == head]
    return near[0] if near else ROUTES[""][0]


def largest_answer(limits: Limits, labels: Sequence[str] | None = None) -> int:
    """An upper bound on the bytes of one answer to a request of max_texts inputs, in any wire format."""
    bound = limits.kind.answer_bound
    if bound == "one_text":  # one vector per token: checked per request (a 413), so one text must fit
        return limits.max_length * (limits.dimensions * FLOAT_CHARS + 2) + 2 * ANSWER_OVERHEAD
    if bound == "checked":  # unbounded but by the vocabulary: each answer is checked when made (a 413)
        per_input = 0
    elif labels is None:
        per_input = limits.dimensions * FLOAT_CHARS
    else:  # scores by label, and v2's label list; then the top label
        per_input = sum(2 * (len(json.dumps(label)) + 2) + FLOAT_CHARS for label in labels)
        per_input += max((len(json.dumps(label)) for label in labels), default=0)
    return sizes.answer_bytes(limits.max_texts, per_input)
