"""OpenAI's embeddings API at `/predictions/NAME/VERSION/v1/embeddings`, and `v1/models`.

Request: `{"input": str | [str] | [int] | [[int]], "model"?, "encoding_format"?: "float" | "base64",
"dimensions"?, "user"?}`, and our extra fields `prompt_name` or `prompt`, `normalize`, `truncate` or `on_overflow`
(`"chunk"`: a text over max_length pooled over windows), `truncation_direction`, and late chunking's `chunking` and
`spans` (then `data` holds one entry per input, then per span, `index` counting entries, each with our `input` and
`span`); other fields are tolerated (as Text Embeddings Inference and infinity do).
Token ids are the text's tokens without special tokens (what OpenAI's tiktoken ids are, or
`tokenizer(text, add_special_tokens=False)`); the model's special tokens are added around them.
Answer: `{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}`, the
embedding as floats or as base64 of little-endian float32 (OpenAI's encoding); a sparse model's embedding is
`{"indices": [...], "values": [...]}` (ids ascending; `encoding_format` float only), and `input_type` ("query" |
"document") picks what encode_query / encode_document would, `max_active_dims` its cut. `dimensions` keeps the first
components and re-normalises them (Matryoshka style). Errors: `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from bucketing.answers import Answer, Options
from bucketing.model_kinds import ONE_PER_INPUT, KindName
from bucketing.protocols.base import (
    Input,
    Limits,
    NotFound,
    Parser,
    RequestError,
    Wire,
    bad,
    check_count,
    is_int,
    json_type,
    quote,
    snake,
)
from bucketing.protocols.inputs import check_text, too_many
from bucketing.protocols.options import OPTION_FIELDS, chunked, read_options
from bucketing.protocols.outputs import refuse_beyond

# Our options an OpenAI body takes as extra fields: all but a classifier's, a sparse model's (added by its kind) and
# `precision` (OpenAI's `encoding_format` says how an embedding is sent).
OPENAI_OPTIONS = tuple(f for f in OPTION_FIELDS if f not in ("raw_scores", "max_active_dims", "precision"))

NAME = "openai"
ANSWERS: tuple[KindName, ...] | None = ONE_PER_INPUT  # not a multi-vector model
EMBEDDINGS = "v1/embeddings"
MODELS = "v1/models"
MAX_MODEL_CHARS = 256
ENCODINGS = ("float", "base64")


def error_body(error: RequestError) -> dict[str, Any]:
    kind = "server_error" if error.status >= 500 else "invalid_request_error"
    return {"error": {"message": error.message, "type": kind, "param": error.param, "code": snake(error.type)}}


@dataclass(frozen=True)
class EmbeddingsRequest:
    inputs: tuple[Input, ...]
    model: str | None = None
    encoding_format: str = "float"
    options: Options = Options()  # dimensions; and our extra fields prompt_name, prompt, normalize

    def where(self, index: int) -> str:
        return f"input[{index}]"

    def render(self, answers: Sequence[Answer], model_name: str) -> Any:
        check_count(self, answers)
        data: list[dict[str, Any]] = []
        for i, a in enumerate(answers):
            if a.spans is None:
                data.append({"object": "embedding", "index": len(data), "embedding": self._encode(a)})
                continue
            for span, row in zip(a.spans, a.values):  # late chunking: per input, then per span
                embedding = self._encode(replace(a, values=row, spans=None))
                data.append(
                    {"object": "embedding", "index": len(data), "embedding": embedding, "input": i, "span": list(span)}
                )
        tokens = sum(a.tokens for a in answers)
        return {
            "object": "list",
            "data": data,
            "model": self.model if self.model is not None else model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def _encode(self, answer: Answer) -> Any:
        if answer.sparse:
            indices, values = answer.sparse_vector(self.options.max_active_dims)
            return {"indices": indices, "values": values}
        vector = answer.vector(self.options.dimensions, self.options.normalize)
        if self.encoding_format == "base64":
            return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        return vector.tolist()


@dataclass(frozen=True)
class ModelsRequest:
    """`GET .../v1/models`: lists this model."""

    inputs: tuple[Input, ...] = ()
    options: Options = Options()

    def where(self, index: int) -> str:
        return f"input[{index}]"

    def render(self, answers: Sequence[Answer], model_name: str) -> Any:
        check_count(self, answers)
        model = {"id": model_name, "object": "model", "created": 0, "owned_by": "torchserve"}
        return {"object": "list", "data": [model]}


def parse_models(body: Any, limits: Limits) -> ModelsRequest:
    """`v1/models` takes no body (a GET); whatever came is ignored."""
    return ModelsRequest()


def parse(body: Any, limits: Limits) -> EmbeddingsRequest:
    """An embeddings request; raises the client's mistake with the parameter at fault."""
    if limits.kind.head != ("embedding",):  # one vector per input: what OpenAI's answer holds
        raise NotFound(
            "NotFound",
            f"this model is {limits.kind.a_model}: it serves POST /predictions/NAME (native JSON, text/plain, "
            f"KServe v1/v2 bodies), not {EMBEDDINGS}",
        )
    if body is None:
        raise bad("EmptyBody", 'the request has no body; send JSON {"input": ..., "model": ...}')
    if not isinstance(body, Mapping):
        raise bad("InvalidRequest", f"expected a JSON object, got a JSON {json_type(body)}")
    if "input" not in body:
        raise bad("InvalidRequest", "'input' is a required property", "input")
    options = _options(body, limits)
    keep = limits.chunk_reach if chunked(options["options"], limits) else limits.max_length
    inputs = _inputs(body["input"], limits, body.get("truncation_direction") == "left", keep)
    if options["options"].prompt and not isinstance(inputs[0], str):
        raise _prompted_ids(body, limits)
    return EmbeddingsRequest(inputs, **options)


def _prompted_ids(body: Mapping[str, Any], limits: Limits) -> RequestError:
    """Token ids with a prompt: sentence-transformers tokenizes prompt + text as one string, whose tokens are not
    always the prompt's then the text's (a byte-level BPE joins the space after "query:" to the first word), so it
    is refused."""
    if body.get("prompt") is not None:
        which = 'a "prompt"'
    elif body.get("prompt_name") is not None:
        which = f'"prompt_name" {quote(body["prompt_name"], 40)}'
    else:
        which = f"the model's default prompt {quote(limits.default_prompt, 40)}"
    return bad(
        "InvalidRequest",
        f"token ids are not served with a prompt ({which}): the tokens of prompt + text can differ from the "
        'prompt\'s tokens followed by the ids; send the text, or "prompt": "" to embed the ids with no prompt',
        "input",
    )


def _options(body: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > MAX_MODEL_CHARS):
        raise bad("InvalidType", f"'model' must be a string of at most {MAX_MODEL_CHARS} characters", "model")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad("InvalidType", f"'user' must be a string, got {json_type(user)}", "user")
    encoding = body.get("encoding_format")
    if encoding is None:
        encoding = "float"
    if encoding not in ENCODINGS:
        raise bad(
            "InvalidRequest",
            f"'encoding_format' must be 'float' or 'base64', got {quote(encoding, 40)}",
            "encoding_format",
        )
    if "precision" in body:  # tolerated fields are ignored: this one would be, silently
        raise bad(
            "InvalidRequest",
            "'precision' is not an OpenAI field: OpenAI's embeddings are float or base64 ('encoding_format'); "
            'binary embeddings are served in our JSON at POST /predictions/NAME ({"texts": [...], "precision": ...})',
            "precision",
        )
    options = read_options(body, limits, (*OPENAI_OPTIONS, *limits.kind.options))
    refuse_beyond(options.outputs, ("dense",), "OpenAI's embeddings answer")  # a BGE-M3 model's other outputs
    if limits.kind.sparse and encoding != "float":
        raise bad(
            "InvalidRequest",
            "'encoding_format' base64 is a dense float32 vector; a sparse model answers 'float' only, each embedding "
            'as {"indices": [...], "values": [...]}',
            "encoding_format",
        )
    return {"model": model, "encoding_format": encoding, "options": options}


def _inputs(value: Any, limits: Limits, left: bool = False, keep: int = 0) -> tuple[Input, ...]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids (`left`: ids over
    max_length keep their last ones; `keep`: the ids an input may hold, max_length unless chunked)."""
    if isinstance(value, str):
        with _param():
            check_text(value, "'input'")
        return (value,)
    if not isinstance(value, list):
        raise bad("InvalidType", f"'input' must be a string or an array, got {json_type(value)}", "input")
    if not value:
        raise bad("EmptyText", "'input' is an empty array", "input")
    first = value[0]
    if is_int(first):
        return (_ids(value, "input", limits, left, keep),)
    if not isinstance(first, (str, list)):
        raise bad(
            "InvalidType",
            f"input[0] must be a string, a token id or an array of token ids, got {json_type(first)}",
            "input",
        )
    if len(value) > limits.max_texts:
        raise too_many(len(value), "input", limits.max_texts)
    kind = str if isinstance(first, str) else list
    out: list[Input] = []
    for i, item in enumerate(value):
        if not isinstance(item, kind) or (kind is list and not item):
            expected = "a string" if kind is str else "a non-empty array of token ids"
            like = " like input[0]" if i else ""
            raise bad(
                "InvalidType",
                f"input[{i}] must be {expected}{like}, got {json_type(item)}"
                f"{' (empty)' if isinstance(item, list) else ''}",
                "input",
            )
        with _param():
            if kind is str:
                check_text(item, f"input[{i}]")
            out.append(item if kind is str else _ids(item, f"input[{i}]", limits, left, keep or limits.max_length))
    return tuple(out)


def _ids(value: list[Any], where: str, limits: Limits, left: bool = False, keep: int = 0) -> tuple[int, ...]:
    """Token ids, each an integer; those served (`keep`: the first max_length, or the last with a `left` cut; a
    chunked input's windows' reach) in the vocabulary. The rest is cut away (truncate, or a 413), so only one more is
    kept, unchecked, on the side cut: it only tells that ids were cut (wrapped in the special tokens, at most
    `keep` of them are kept, never it)."""
    keep = keep or limits.max_length
    for j, token in enumerate(value):
        if type(token) is not int:  # noqa: E721 - bool is not a token id; one fast pass over a long list
            raise bad("InvalidType", f"{where}[{j}] must be a token id (an integer), got {json_type(token)}", "input")
    first = max(len(value) - keep, 0) if left else 0
    for j, token in enumerate(value[first : first + keep], first):
        if not 0 <= token < limits.vocab_size:
            shown = token if abs(token) < 10**12 else "a larger number"
            raise bad(
                "InvalidRequest",
                f"{where}[{j}] = {shown} is not a token id of this model's vocabulary (0 to {limits.vocab_size - 1})",
                "input",
            )
    return tuple(value[-keep - 1 :] if left else value[: keep + 1])


@contextmanager
def _param() -> Iterator[None]:
    """An error raised within names the parameter "input" when it names none."""
    try:
        yield
    except RequestError as e:
        if e.param:
            raise
        raise e.with_param("input") from None


ROUTES: dict[str, Parser] = {EMBEDDINGS: parse, MODELS: parse_models}
SERVED = f"POST /predictions/NAME/VERSION/{EMBEDDINGS} (OpenAI, embedding models), GET .../{MODELS}"

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body)
