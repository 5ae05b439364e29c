"""Text Embeddings Inference's `/tokenize` at `/predictions/NAME/VERSION/tokenize`, any model.

Request: `{"inputs": str | [str], "add_special_tokens"? (true), "prompt_name"?}`. Answer: per input (a single
string too) a list of tokens `{"id", "text", "special", "start", "stop"}`: a special token's text is the token
and its offsets null; another's text is its piece of the input (the prompt, if any, put before it) and its
offsets UTF-8 byte offsets into that, as TEI's. The tokens are those the model sees: cut at handler.max_length
(TEI does not cut here). Errors in TEI's shape (`tei.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bucketing.answers import Answer, Options
from bucketing.model_kinds import KindName
from bucketing.protocols import tei
from bucketing.protocols.base import Input, Limits, ServerError, Wire, check_count, json_type
from bucketing.protocols.options import read_options
from bucketing.protocols.tei import error_body as error_body
from bucketing.protocols.tei import own_error as own_error

NAME = "tei-tokenize"
ANSWERS: tuple[KindName, ...] | None = None  # the model kinds it answers: every kind
PATH = "tokenize"
SERVED = f"POST /predictions/NAME/VERSION/{PATH} (TEI's tokenize)"


@dataclass(frozen=True)
class TokenizeRequest:
    """Answered by the tokenizer alone: no input reaches the model (`inputs` is empty)."""

    texts: tuple[str, ...]
    tools: tei.TextTools
    add_special_tokens: bool = True
    options: Options = Options()
    inputs: tuple[Input, ...] = ()

    def where(self, index: int) -> str:
        return f"inputs[{index}]"

    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        prompt = self.options.prompt
        return [self.tools.tokenize(prompt + text, self.add_special_tokens) for text in self.texts]


def facts(limits: Limits) -> tei.ModelFacts:
    """The model facts the handler gives every request (raises a server fault when they are missing)."""
    if not isinstance(limits.model, tei.ModelFacts):
        raise ServerError("Backend", "the handler gave no tokenizer to this route")
    return limits.model


def parse(body: Any, limits: Limits) -> TokenizeRequest:
    model = facts(limits)
    request = tei.with_inputs(body)
    parsed = tei.texts(request["inputs"], limits)
    for i, text in enumerate(parsed[0]):
        if len(text) > model.max_chars:
            raise tei.validation(
                f"inputs[{i}] has {len(text)} characters; /tokenize reads at most {model.max_chars}", "inputs"
            )
    special = request.get("add_special_tokens", True)
    if not isinstance(special, bool):
        raise tei.validation(f"`add_special_tokens` must be true or false, got {json_type(special)}")
    with tei.own_errors():
        options = read_options(request, limits, ("prompt_name",))
    return TokenizeRequest(parsed[0], model.tools, special, options)


ROUTES = {PATH: parse}

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body, own_error=own_error)
