"""The Cohere/Jina rerank API (as vLLM and infinity serve it, and LangChain's and LlamaIndex's rerankers call it)
at `/predictions/NAME/VERSION/v1/rerank`, for a one-label cross-encoder.

Request: `{"model"?, "query": str, "documents": [str | {"text": str}], "top_n"?, "return_documents"?}`, and our
`prompt_name` or `prompt` (before the query). Answer:
`{"model", "results": [{"index", "relevance_score", "document"?: {"text"}}], "usage": {"total_tokens"}}`, best
first, at most `top_n`. Errors in OpenAI's shape (as vLLM answers them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bucketing.answers import Answer, Options
from bucketing.model_kinds import ONE_PER_INPUT, KindName
from bucketing.protocols.base import Limits, Pair, RequestError, Wire, bad, check_count, is_int, json_type
from bucketing.protocols.inputs import texts
from bucketing.protocols.openai import MAX_MODEL_CHARS
from bucketing.protocols.openai import error_body as error_body
from bucketing.protocols.options import read_options
from bucketing.protocols.tei_rerank import rerank_query

NAME = "cohere-rerank"
ANSWERS: tuple[KindName, ...] | None = ONE_PER_INPUT  # not a multi-vector model
PATH = "v1/rerank"
PROMPT_FIELDS = ("prompt_name", "prompt")  # ours, put before the query as CrossEncoder.rank puts them
SERVED = f"POST /predictions/NAME/VERSION/{PATH} (Cohere/Jina rerank, one-label classifiers)"


@dataclass(frozen=True)
class CohereRerankRequest:
    inputs: tuple[Pair, ...]
    model: str | None = None
    top_n: int | None = None
    return_documents: bool = False
    options: Options = Options()

    def where(self, index: int) -> str:
        return f"documents[{index}]"

    def render(self, answers: Sequence[Answer], model_name: str) -> Any:
        check_count(self, answers)
        scores = [a.fields()["score"] for a in answers]
        ranked = sorted(range(len(answers)), key=lambda i: -scores[i])[: self.top_n]
        results = []
        for i in ranked:
            document = {"document": {"text": self.inputs[i].document}} if self.return_documents else {}
            results.append({"index": i, "relevance_score": scores[i], **document})
        tokens = sum(a.tokens for a in answers)
        model = self.model if self.model is not None else model_name
        return {"model": model, "results": results, "usage": {"total_tokens": tokens}}


def parse(body: Any, limits: Limits) -> CohereRerankRequest:
    query = rerank_query(body, limits, PATH, "documents")
    raw = body.get("documents")
    if isinstance(raw, list):  # Cohere also takes {"text": ...} objects
        raw = [d["text"] if isinstance(d, Mapping) and isinstance(d.get("text"), str) else d for d in raw]
    try:
        documents = texts(raw, "documents", limits.max_texts)
    except RequestError as e:
        raise e.with_param("documents") from None
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > MAX_MODEL_CHARS):
        raise bad("InvalidType", f"'model' must be a string of at most {MAX_MODEL_CHARS} characters", "model")
    top_n = body.get("top_n")
    if top_n is not None and (not is_int(top_n) or top_n < 1):
        raise bad("InvalidRequest", f"'top_n' must be a positive integer, got {json_type(top_n)}", "top_n")
    return_documents = body.get("return_documents", False)
    if not isinstance(return_documents, bool):
        raise bad(
            "InvalidType",
            f"'return_documents' must be true or false, got {json_type(return_documents)}",
            "return_documents",
        )
    options = read_options(body, limits, PROMPT_FIELDS)  # none named: the model's default (CrossEncoder.rank's)
    return CohereRerankRequest(tuple(Pair(query, d) for d in documents), model, top_n, return_documents, options)


ROUTES = {PATH: parse}

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body)
