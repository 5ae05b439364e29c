"""Text Embeddings Inference's `/embed_sparse` at `/predictions/NAME/VERSION/embed_sparse`, for a sparse model.

Request: `{"inputs": str | [str], "truncate"?, "truncation_direction"?, "prompt_name"?}`; other fields are ignored,
as TEI ignores them. Answer, as TEI's: one list per input of `{"index", "value"}` objects, the non-zero vocabulary
ids ascending (a single string too answers a list of one). `prompt_name` "query" is `encode_query` (its prompt and,
for a Router, its query route), "document", "passage" or "corpus" `encode_document` with that prompt; any other of
the model's prompts `encode(prompt_name=...)`; none: `encode()`. Errors in TEI's shape (`tei.py`); a dense model
answers TEI's 424.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from bucketing.answers import Answer
from bucketing.model_kinds import ONE_PER_INPUT, KindName
from bucketing.protocols import tei
from bucketing.protocols.base import Limits, Wire, check_count
from bucketing.protocols.outputs import offers
from bucketing.protocols.tei import error_body as error_body
from bucketing.protocols.tei import own_error as own_error

NAME = "tei-embed-sparse"
ANSWERS: tuple[KindName, ...] | None = ONE_PER_INPUT  # not a multi-vector model
PATH = "embed_sparse"
SERVED = f"POST /predictions/NAME/VERSION/{PATH} (TEI's embed_sparse, sparse models)"
FIELDS = ("truncate", "truncation_direction", "prompt_name")
DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # prompt names that ask for encode_document (with that prompt)


@dataclass(frozen=True)
class EmbedSparseRequest(tei.TeiInputs):
    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        out = []
        for a in answers:
            indices, values = a.sparse_vector(self.options.max_active_dims)
            out.append([{"index": i, "value": v} for i, v in zip(indices, values)])
        return out


def input_type(prompt_name: Any) -> str | None:
    """The input_type TEI's `prompt_name` implies: encode_query's prompt or one of encode_document's."""
    return "query" if prompt_name == "query" else "document" if prompt_name in DOCUMENT_PROMPTS else None


def parse(body: Any, limits: Limits) -> EmbedSparseRequest:
    if not (limits.kind.sparse or offers(limits.kind, "sparse")):  # a BGE-M3 model: its lexical weights
        raise tei.refused_here("Model is not an embedding model with SPLADE pooling", limits)
    parsed = tei.parse_texts(EmbedSparseRequest, body, limits, FIELDS)
    kind = input_type(body.get("prompt_name"))  # an object: parse_texts read it
    outputs = ("sparse",) if offers(limits.kind, "sparse") else parsed.options.outputs  # what a BGE-M3 answer keeps
    return replace(parsed, options=replace(parsed.options, input_type=kind, outputs=outputs))


ROUTES = {PATH: parse}

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body, own_error=own_error)
