"""Cohere's embed API v2 (as `cohere.ClientV2.embed` calls it) at `/predictions/NAME/VERSION/v2/embed`, for
dense embedding models.

Request: `{"model"?, "texts": [str], "input_type"?, "embedding_types"? (["float"]), "truncate"?,
"output_dimension"?, "max_tokens"?}`. `input_type` search_query / search_document are our `input_type` query /
document (encode_query / encode_document's prompts); classification / clustering take the model's prompt of that
name where it has one, else its default. `embedding_types`: float, binary, ubinary (sentence-transformers'
`quantize_embeddings` packings); int8, uint8 with the model's fixed ranges (refused in one line where it has
none); base64 refused. `truncate`: NONE (a text over max_length is a 413), START (its last tokens kept), END (its
first kept); absent: as `handler.on_overflow` says.
`output_dimension` is our `dimensions`; `max_tokens` below max_length is refused (texts are cut at max_length).
Answer: `{"id", "embeddings": {type: [...]}, "texts", "meta": {"api_version", "billed_units": {"input_tokens"}},
"response_type": "embeddings_by_type"}`. Errors: `{"message"}`, as Cohere answers them. Other fields (`priority`)
are tolerated.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bucketing.answers import Answer, Options
from bucketing.model_kinds import ONE_PER_INPUT, KindName
from bucketing.protocols.base import Limits, RequestError, Wire, bad, check_count, is_int, json_type, quote
from bucketing.protocols.inputs import texts
from bucketing.protocols.options import check_cut_ranges, late_refused, ranges_missing, read_options
from bucketing.quantize import PRECISIONS

NAME = "cohere-embed"
ANSWERS: tuple[KindName, ...] | None = ONE_PER_INPUT  # not a multi-vector model (dense ones: `parse`)
PATH = "v2/embed"
SERVED = f"POST /predictions/NAME/VERSION/{PATH} (Cohere embed v2, embedding models)"
TYPES = ("float", "binary", "ubinary")  # Cohere's embedding types we answer exactly (PRECISIONS' names)
RANGED = ("int8", "uint8")  # answered where the model stores fixed ranges (`quantize.RANGES_FILE`)
REFUSED_TYPES = {"base64": "is not served; ask float"}
KNOWN_TYPES = (*TYPES, *RANGED, *REFUSED_TYPES)  # Cohere's embedding types, each answered or refused in its words
TRUNCATE: dict[Any, dict[str, Any]] = {
    "NONE": {"truncate": False},
    "START": {"truncate": True, "truncation_direction": "left"},
    "END": {"truncate": True},
}
ROLES = {"search_query": "query", "search_document": "document"}  # our input_type for Cohere's
NAMED = ("classification", "clustering")  # Cohere's input types taken as a prompt's name, where the model has it


def error_body(error: RequestError) -> dict[str, Any]:
    """Cohere's error shape: `{"message"}`."""
    return {"message": error.message}


@dataclass(frozen=True)
class CohereEmbedRequest:
    inputs: tuple[str, ...]
    types: tuple[str, ...] = ("float",)
    options: Options = Options()
    ranges: Any = field(default=None, compare=False)  # the model's fixed int8/uint8 ranges, where asked

    def where(self, index: int) -> str:
        return f"texts[{index}]"

    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        o = replace(self.options, ranges=self.ranges)
        vectors = [(a, a.vector(o.dimensions, o.normalize)) for a in answers]
        embeddings = {t: [a.in_precision(v, o, t).tolist() for a, v in vectors] for t in self.types}
        return {
            "id": str(uuid.uuid4()),
            "embeddings": embeddings,
            "texts": list(self.inputs),
            "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": sum(a.tokens for a in answers)}},
            "response_type": "embeddings_by_type",
        }


def parse(body: Any, limits: Limits) -> CohereEmbedRequest:
    if not limits.kind.dense_vector:
        raise bad("InvalidRequest", f"Cohere's embed answers dense embeddings; this is {limits.kind.a_model}")
    if not isinstance(body, Mapping):
        raise bad("InvalidRequest", f'expected a JSON object {{"texts": [...], ...}}, got a JSON {json_type(body)}')
    for name in ("images", "inputs"):
        if body.get(name) is not None:
            raise bad("InvalidRequest", f"'{name}' is not served: this model embeds 'texts' only", name)
    late = late_refused(body, "Cohere's embed API")
    if late:
        raise bad("InvalidRequest", late[1], late[0])
    if "texts" not in body:
        raise bad("InvalidRequest", "'texts' is required", "texts")
    inputs = texts(body["texts"], "texts", limits.max_texts)
    types = embedding_types(body.get("embedding_types"), limits.ranges is not None)
    ranged = [t for t in types if PRECISIONS[t].ranged]
    options = read_options(mapped(body, limits), limits)
    if ranged:
        check_cut_ranges(ranged[0], options, limits, "embedding type", "output_dimension")
    return CohereEmbedRequest(inputs, types, options, limits.ranges if ranged else None)


def embedding_types(value: Any, ranged: bool = False) -> tuple[str, ...]:
    """`embedding_types` (absent: float), each once, in the request's order (`ranged`: the model stores ranges,
    so int8 and uint8 are answered)."""
    if value is None:
        return ("float",)
    if not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value):
        raise bad("InvalidType", "'embedding_types' must be a non-empty array of strings", "embedding_types")
    for t in value:
        if t in RANGED:
            if not ranged:
                raise bad("InvalidRequest", f"embedding type {ranges_missing(t)}", "embedding_types")
            continue
        if t in REFUSED_TYPES:
            raise bad("InvalidRequest", f"embedding type {t!r} {REFUSED_TYPES[t]}", "embedding_types")
        if t not in TYPES:
            raise bad(
                "InvalidRequest",
                f"embedding type {quote(t, 40)} is not one of {', '.join(map(repr, KNOWN_TYPES))}",
                "embedding_types",
            )
    return tuple(dict.fromkeys(value))


def mapped(body: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    """Cohere's fields as our options: input_type, truncate, output_dimension (max_tokens checked)."""
    out: dict[str, Any] = {}
    input_type = body.get("input_type")
    if input_type in ROLES:
        out["input_type"] = ROLES[input_type]
    elif input_type in NAMED:
        if input_type in dict(limits.prompts):
            out["prompt_name"] = input_type
    elif input_type is not None:
        allowed = ", ".join(map(repr, (*ROLES, *NAMED)))
        raise bad("InvalidRequest", f"'input_type' must be one of {allowed}, got {quote(input_type, 40)}", "input_type")
    truncate = body.get("truncate")  # absent: as handler.on_overflow says (Cohere's default is END)
    if truncate is not None and truncate not in TRUNCATE:
        raise bad("InvalidRequest", f"'truncate' must be NONE, START or END, got {quote(truncate, 40)}", "truncate")
    out.update(TRUNCATE.get(truncate, {}))
    dimension = limits.read_dimensions(body.get("output_dimension"), "output_dimension", "'")
    if dimension is not None:
        out["dimensions"] = dimension
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not is_int(max_tokens) or max_tokens < limits.max_length):
        raise bad(
            "InvalidRequest",
            f"'max_tokens' below max_length is not served: texts are cut at this model's max_length "
            f"({limits.max_length} tokens) as 'truncate' says; got {quote(max_tokens, 40)}",
            "max_tokens",
        )
    return out


ROUTES = {PATH: parse}

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body)
