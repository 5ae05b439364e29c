"""Text Embeddings Inference's `GET /info` at `/predictions/NAME/VERSION/info`: the model and its limits.

Answer: TEI's info object, from the handler's settings: `model_id` (the TorchServe model name), `model_dtype`,
`model_type` (`{"embedding": {"pooling"}}`, `{"classifier": {"id2label", "label2id"}}`, or `{"reranker": ...}`
for a one-label classifier; TEI has no multi-vector type: such a model is an embedding model with pooling `none`,
a sparse one `splade`, as TEI says, or `csr`), `max_input_length` (handler.max_length), `max_batch_tokens`,
`max_client_batch_size` (handler.max_texts_per_request), `auto_truncate` (handler.on_overflow: truncate),
`tokenization_workers` (1: each worker tokenizes its own batches), `version` (this package's). What TorchServe
decides (`max_concurrent_requests`, `max_batch_requests`) and what it cannot know (`model_sha`, `sha`,
`docker_label`) are null. Beside TEI's fields, `embedding_ranges`: a dense model's fixed int8/uint8 ranges as a
`[minimums, maximums]` pair of per-dimension lists (`quantize.RANGES_FILE`), or null; `truncate_dim`: a dense
model's own cut (sentence-transformers' truncate_dim: the size of its answers, and the most `dimensions` may ask), or
null. Any body is ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bucketing.answers import Answer, Options
from bucketing.model_kinds import KindName
from bucketing.protocols import tei
from bucketing.protocols.base import Input, Limits, Wire, check_count
from bucketing.protocols.tei import error_body as error_body
from bucketing.protocols.tei import own_error as own_error
from bucketing.protocols.tei_tokenize import facts

NAME = "tei-info"
ANSWERS: tuple[KindName, ...] | None = None  # the model kinds it answers: every kind
PATH = "info"
SERVED = f"GET /predictions/NAME/VERSION/{PATH} (TEI's info)"


@dataclass(frozen=True)
class InfoRequest:
    """Answered from the settings alone: no input reaches the model (`inputs` is empty)."""

    model: tei.ModelFacts
    limits: Limits
    options: Options = Options()
    inputs: tuple[Input, ...] = ()

    def where(self, index: int) -> str:
        return "info"

    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        return {
            "model_id": model_name,
            "model_sha": None,
            "model_dtype": self.model.dtype,
            "served_model_name": model_name,
            "model_type": self.model.model_type(),
            "max_concurrent_requests": None,
            "max_input_length": self.limits.max_length,
            "max_batch_tokens": self.model.max_batch_tokens,
            "max_batch_requests": None,
            "max_client_batch_size": self.limits.max_texts,
            "auto_truncate": self.model.auto_truncate,
            "tokenization_workers": 1,
            "version": tei.VERSION,
            "sha": None,
            "docker_label": None,
            "embedding_ranges": self.limits.ranges.bounds.tolist() if self.limits.ranges is not None else None,
            "truncate_dim": self.limits.truncate_dim,
        }


def parse(body: Any, limits: Limits) -> InfoRequest:
    return InfoRequest(facts(limits), limits)


ROUTES = {PATH: parse}

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body, own_error=own_error)
