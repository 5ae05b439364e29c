"""Text Embeddings Inference's `/decode` at `/predictions/NAME/VERSION/decode`, any model.

Request: `{"ids": [int] | [[int]], "skip_special_tokens"? (true)}`, each id in the model's vocabulary. Answer:
a list of texts, one per list of ids (one list of ids too answers a list of one). Errors in TEI's shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bucketing.answers import Answer, Options
from bucketing.model_kinds import KindName
from bucketing.protocols import tei
from bucketing.protocols.base import Input, Limits, Wire, check_count, is_int, json_type
from bucketing.protocols.tei import error_body as error_body
from bucketing.protocols.tei import own_error as own_error
from bucketing.protocols.tei_tokenize import facts

NAME = "tei-decode"
ANSWERS: tuple[KindName, ...] | None = None  # the model kinds it answers: every kind
PATH = "decode"
SERVED = f"POST /predictions/NAME/VERSION/{PATH} (TEI's decode)"


@dataclass(frozen=True)
class DecodeRequest:
    """Answered by the tokenizer alone: no input reaches the model (`inputs` is empty)."""

    ids: tuple[tuple[int, ...], ...]
    tools: tei.TextTools
    skip_special_tokens: bool = True
    options: Options = Options()
    inputs: tuple[Input, ...] = ()

    def where(self, index: int) -> str:
        return f"ids[{index}]"

    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        return [self.tools.decode(ids, self.skip_special_tokens) for ids in self.ids]


def token_ids(value: Any, where: str, limits: Limits) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise tei.validation(f"{where} must be a list of token ids, got {json_type(value)}", "ids")
    for j, token in enumerate(value):
        if not is_int(token) or not 0 <= token < limits.vocab_size:
            shown = json_type(token) if not is_int(token) else str(token) if abs(token) < 10**12 else "a larger number"
            raise tei.validation(
                f"{where}[{j}] must be a token id of this model's vocabulary (0 to {limits.vocab_size - 1}), "
                f"got {shown}",
                "ids",
            )
    return tuple(value)


def parse(body: Any, limits: Limits) -> DecodeRequest:
    model = facts(limits)
    request = tei.body_object(body, '"ids": [...]')
    if "ids" not in request:
        raise tei.validation("missing field `ids`", "ids")
    value = request["ids"]
    batch = isinstance(value, list) and bool(value) and isinstance(value[0], list)
    if isinstance(value, list) and len(value) > limits.max_texts and batch:
        raise tei.too_many(len(value), limits)
    lists = value if batch else [value]
    parsed = []
    for i, ids in enumerate(lists):
        parsed.append(token_ids(ids, f"ids[{i}]" if batch else "`ids`", limits))
    skip = request.get("skip_special_tokens", True)
    if not isinstance(skip, bool):
        raise tei.validation(f"`skip_special_tokens` must be true or false, got {json_type(skip)}")
    return DecodeRequest(tuple(parsed), model.tools, skip)


ROUTES = {PATH: parse}

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body, own_error=own_error)
