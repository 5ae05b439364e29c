"""Text Embeddings Inference's `/similarity` at `/predictions/NAME/VERSION/similarity`, for an embedding model
(`InferenceClient.sentence_similarity` posts its body).

Request: `{"inputs": {"source_sentence": str, "sentences": [str]}, "parameters"?: {"truncate",
"truncation_direction", "prompt_name"}}`. Answer: the cosine similarity of each sentence's embedding with the
source sentence's, in order (what `SentenceTransformer.similarity` gives with cosine). The source counts against
max_texts_per_request, as in TEI. Errors in TEI's shape (`tei.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bucketing.answers import Answer, Options
from bucketing.model_kinds import ONE_PER_INPUT, KindName
from bucketing.protocols import tei
from bucketing.protocols.base import Limits, Wire, check_count, json_type
from bucketing.protocols.options import read_options
from bucketing.protocols.tei import error_body as error_body
from bucketing.protocols.tei import own_error as own_error

NAME = "tei-similarity"
ANSWERS: tuple[KindName, ...] | None = ONE_PER_INPUT  # not a multi-vector model
PATH = "similarity"
SERVED = f"POST /predictions/NAME/VERSION/{PATH} (TEI's similarity, embedding models)"
FIELDS = ("truncate", "truncation_direction", "prompt_name")


@dataclass(frozen=True)
class SimilarityRequest:
    inputs: tuple[str, ...]  # the source sentence, then the sentences
    options: Options = Options()

    def where(self, index: int) -> str:
        return "`inputs.source_sentence`" if index == 0 else f"inputs.sentences[{index - 1}]"

    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        vectors = np.stack([a.vector(normalize=True) for a in answers]).astype(np.float64)
        return [float(v) for v in vectors[1:] @ vectors[0]]


def parse(body: Any, limits: Limits) -> SimilarityRequest:
    if not limits.kind.dense_vector:
        raise tei.backend(f"Model is not an embedding model: this is {limits.kind.a_model}")
    request = tei.body_object(body, '"inputs": {"source_sentence", "sentences"}')
    inputs = request.get("inputs")
    if not isinstance(inputs, Mapping):
        raise tei.validation(
            f'`inputs` must be an object {{"source_sentence", "sentences"}}, got {json_type(inputs)}', "inputs"
        )
    sentences = inputs.get("sentences")
    if not isinstance(sentences, list):
        raise tei.validation(f"`inputs.sentences` must be a list of strings, got {json_type(sentences)}", "inputs")
    if not sentences:
        raise tei.empty("inputs.sentences")
    if len(sentences) + 1 > limits.max_texts:
        raise tei.too_many(len(sentences) + 1, limits)
    source = inputs.get("source_sentence")
    if not isinstance(source, str):
        raise tei.validation(f"`inputs.source_sentence` must be a string, got {json_type(source)}", "inputs")
    tei.texts(source, limits, "inputs.source_sentence")  # checked as TEI checks a text; kept as it came
    rest = tei.texts(sentences, limits, "inputs.sentences")
    parameters = request.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise tei.validation(f"`parameters` must be an object, got {json_type(parameters)}", "parameters")
    with tei.own_errors():
        options = read_options(tei.direction(parameters or {}), limits, FIELDS)
    return SimilarityRequest((source, *rest[0]), options)


ROUTES = {PATH: parse}

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body, own_error=own_error)
