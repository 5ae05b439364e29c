"""Text Embeddings Inference's rerank API at `/predictions/NAME/VERSION/rerank`, for a one-label cross-encoder.

Request: `{"query": str, "texts": [str], "raw_scores"?, "return_text"?, "truncate"?, "truncation_direction"?}`,
and our `prompt_name` or `prompt` (before the query, as `CrossEncoder.rank` puts it); each text is scored with the
query as one pair. Answer: `[{"index", "score", "text"?}]`, best score first (the
model's activation, or its logit with `raw_scores`). Errors in TEI's shape, `{"error", "error_type"}`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bucketing.answers import Answer, Options
from bucketing.model_kinds import ONE_PER_INPUT, KindName
from bucketing.protocols.base import Limits, NotFound, Pair, RequestError, Wire, bad, check_count, json_type
from bucketing.protocols.inputs import check_text, texts
from bucketing.protocols.options import read_options

NAME = "tei-rerank"
ANSWERS: tuple[KindName, ...] | None = ONE_PER_INPUT  # not a multi-vector model
PATH = "rerank"
SERVED = f"POST /predictions/NAME/VERSION/{PATH} (TEI's rerank, one-label classifiers)"
FIELDS = ("raw_scores", "truncate", "truncation_direction", "prompt_name", "prompt")  # prompts: CrossEncoder.rank's


def error_body(error: RequestError) -> dict[str, Any]:
    return {"error": error.message, "error_type": error.type}


@dataclass(frozen=True)
class RerankRequest:
    inputs: tuple[Pair, ...]
    options: Options = Options()
    return_text: bool = False

    def where(self, index: int) -> str:
        return f"texts[{index}]"

    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        scored = [(i, a.fields(self.options)["score"]) for i, a in enumerate(answers)]
        ranked = sorted(scored, key=lambda pair: -pair[1])
        text: Callable[[int], dict[str, str]] = (
            (lambda i: {"text": self.inputs[i].document}) if self.return_text else (lambda i: {})
        )
        return [{"index": i, "score": score, **text(i)} for i, score in ranked]


def one_label_classifier(limits: Limits, route: str) -> None:
    """Reranking needs a classification model with one label (a relevance score)."""
    if not limits.kind.classifier or limits.dimensions != 1:
        what = f"is {limits.kind.a_model}" if not limits.kind.classifier else f"has {limits.dimensions} labels"
        raise NotFound(
            "NotFound", f"{route} serves one-label classification models (cross-encoders); this model {what}"
        )


def rerank_query(body: Any, limits: Limits, route: str, documents: str) -> str:
    """A rerank request's query, once the model is a one-label classifier and the body an object."""
    one_label_classifier(limits, route)
    if not isinstance(body, Mapping):
        raise bad("InvalidRequest", f'expected a JSON object {{"query", "{documents}"}}, got a JSON {json_type(body)}')
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise bad(
            "InvalidType" if not isinstance(query, str) else "EmptyText",
            f'"query" must be a non-empty string, got {json_type(query)}',
            "query",
        )
    try:
        check_text(query, '"query"')  # a lone surrogate: the client's 400, as in a text
    except RequestError as e:
        raise e.with_param("query") from None
    return query


def parse(body: Any, limits: Limits) -> RerankRequest:
    query = rerank_query(body, limits, PATH, "texts")
    documents = texts(body.get("texts"), "texts", limits.max_texts)
    options = read_options(body, limits, FIELDS)
    return_text = body.get("return_text", False)
    if not isinstance(return_text, bool):
        raise bad("InvalidType", f'"return_text" must be true or false, got {json_type(return_text)}', "return_text")
    return RerankRequest(tuple(Pair(query, d) for d in documents), options, return_text)


ROUTES = {PATH: parse}

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body)
