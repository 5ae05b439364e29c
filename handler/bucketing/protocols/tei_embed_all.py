"""Text Embeddings Inference's `/embed_all` at `/predictions/NAME/VERSION/embed_all`: token embeddings, for a
multi-vector model (`handler.task: multivector`).

Request: `{"inputs": str | [str], "truncate"?, "truncation_direction"?, "prompt_name"?}`, and this handler's
`input_type` ("query" | "document", as `encode_query`/`encode_document`; absent: `encode()`); other fields are
ignored, as TEI ignores them. Answer: TEI's shape, a list per input (a single string too) of its kept tokens'
vectors, as the model's chain gives them (normalised when it ends in `Normalize`). Any other model: TEI's 424.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from bucketing.answers import Answer
from bucketing.model_kinds import KindName
from bucketing.protocols import tei
from bucketing.protocols.base import Limits, Wire, check_count
from bucketing.protocols.outputs import offers
from bucketing.protocols.tei import error_body as error_body
from bucketing.protocols.tei import own_error as own_error

NAME = "tei-embed-all"
ANSWERS: tuple[KindName, ...] | None = None  # the model kinds it answers: every kind
PATH = "embed_all"
SERVED = f"POST /predictions/NAME/VERSION/{PATH} (TEI's token embeddings, multi-vector models)"
FIELDS = ("truncate", "truncation_direction", "prompt_name", "input_type")


@dataclass(frozen=True)
class EmbedAllRequest(tei.TeiInputs):
    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        return [a.vectors(self.options).tolist() for a in answers]  # type: ignore[attr-defined]


def parse(body: Any, limits: Limits) -> EmbedAllRequest:
    if not (limits.kind.per_token or offers(limits.kind, "colbert")):  # a BGE-M3 model: its ColBERT vectors
        raise tei.refused_here("/embed_all (token embeddings) is served for multi-vector models", limits)
    parsed = tei.parse_texts(EmbedAllRequest, body, limits, FIELDS)
    if offers(limits.kind, "colbert"):  # what a BGE-M3 answer keeps, and its size is counted by
        return replace(parsed, options=replace(parsed.options, outputs=("colbert",)))
    return parsed


ROUTES = {PATH: parse}

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body, own_error=own_error)
