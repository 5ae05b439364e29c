"""Text Embeddings Inference at the plain predictions path, so a client whose URL is `.../predictions/NAME/1.0`
works unchanged (`huggingface_hub.InferenceClient(model=URL)` posts there), as TEI's own `/` does: by the model
kind, `/embed` for an embedding model and `/predict` for a classifier; a body `{"query", "texts"}` is `/rerank`,
and `{"inputs": {"source_sentence", "sentences"}}` is `/similarity` (what `InferenceClient.sentence_similarity`
posts; TEI's `/` takes it only when started for that task).

Its claim on a body at the plain path, by shape: `{"inputs": str}`, `{"inputs": [...]}` whose items are no JSON
objects (strings, or a classifier's pairs as lists), or `{"inputs": {"source_sentence", ...}}`. KServe v2 also
sends `inputs`, but as a list of tensor objects, which this claim leaves to it (this claim is tried before it).
Errors in TEI's shape (`tei.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bucketing.model_kinds import ONE_PER_INPUT, KindName
from bucketing.protocols import tei, tei_embed, tei_predict, tei_rerank, tei_similarity
from bucketing.protocols.base import Limits, Request, Wire
from bucketing.protocols.tei import error_body as error_body
from bucketing.protocols.tei import own_error as own_error

NAME = "tei"
ANSWERS: tuple[KindName, ...] | None = ONE_PER_INPUT  # not a multi-vector model
SERVED = (
    "POST /predictions/NAME[/VERSION] with TEI's {\"inputs\"} (embed, or a classifier's predict) or "
    '{"query", "texts"} (rerank), {"inputs": {"source_sentence", "sentences"}} (similarity)'
)
ROUTES: dict[str, Any] = {}  # reached at the plain predictions path; its body is claimed (`claims`)


def claims(body: Any) -> bool:
    """Whether a body at the plain predictions path is a TEI request."""
    if not isinstance(body, Mapping):
        return False
    if "inputs" in body:
        inputs = body["inputs"]
        if isinstance(inputs, Mapping):
            return "source_sentence" in inputs
        return isinstance(inputs, str) or (
            isinstance(inputs, list) and bool(inputs) and not any(isinstance(i, Mapping) for i in inputs)
        )
    return isinstance(body.get("query"), str) and isinstance(body.get("texts"), list)


def parse(body: Any, limits: Limits) -> Request:
    if "inputs" not in body:
        with tei.own_errors():
            return tei_rerank.parse(body, limits)
    if isinstance(body["inputs"], Mapping):
        return tei_similarity.parse(body, limits)
    if limits.kind.classifier:
        return tei_predict.parse(body, limits)
    return tei_embed.parse(body, limits)


WIRE = Wire(
    name=NAME,
    routes=ROUTES,
    answers=ANSWERS,
    served=SERVED,
    error_body=error_body,
    claims=claims,
    claimed=parse,
    own_error=own_error,
)
