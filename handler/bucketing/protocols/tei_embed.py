"""Text Embeddings Inference's `/embed` at `/predictions/NAME/VERSION/embed`, for an embedding model.

Request: `{"inputs": str | [str], "normalize"?, "truncate"?, "truncation_direction"?, "prompt_name"?,
"dimensions"?}`; other fields are ignored, as TEI ignores them. Answer: a list of float lists, one per input (a
single string too answers a list of one). `normalize` absent: the model's own (sentence-transformers': its
`Normalize` module), where TEI normalises unless told `false`; `truncate` absent: handler.on_overflow (TEI's
`--auto-truncate`). `dimensions` keeps the first components, re-normalised when normalised. Errors in TEI's shape
and status codes (`tei.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bucketing.answers import Answer
from bucketing.model_kinds import ONE_PER_INPUT, KindName
from bucketing.protocols import tei
from bucketing.protocols.base import Limits, Wire, check_count
from bucketing.protocols.tei import error_body as error_body
from bucketing.protocols.tei import own_error as own_error

NAME = "tei-embed"
ANSWERS: tuple[KindName, ...] | None = ONE_PER_INPUT  # not a multi-vector model
PATH = "embed"
SERVED = f"POST /predictions/NAME/VERSION/{PATH} (TEI's embed, embedding models)"
FIELDS = ("normalize", "truncate", "truncation_direction", "prompt_name", "dimensions")


@dataclass(frozen=True)
class EmbedRequest(tei.TeiInputs):
    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        return [a.vector(self.options.dimensions, self.options.normalize).tolist() for a in answers]


def parse(body: Any, limits: Limits) -> EmbedRequest:
    if not limits.kind.dense_vector:
        raise tei.refused_here(
            "Model is not a dense embedding model" if limits.kind.sparse else "Model is not an embedding model", limits
        )
    return tei.parse_texts(EmbedRequest, body, limits, FIELDS)


ROUTES = {PATH: parse}

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body, own_error=own_error)
