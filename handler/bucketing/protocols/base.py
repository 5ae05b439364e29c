"""What every wire format shares: client errors, limits, one input's answer, body decoding and safe quoting.

Pure: no torch, no I/O (numpy for vectors). A wire format (native, KServe v1/v2, OpenAI) is a module that offers `NAME`,
`parse(body, limits) -> Request | RequestError` and `error_body(error)`; see `protocols/__init__.py`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..answers import Answer, Options
from ..kinds import KINDS

BODY_KEYS = ("body", "data")
QUOTE_CHARS = 100  # at most this much of anything a client sent is quoted back in an error message
NAMES_SHOWN = 5  # at most this many unknown keys are named in one message
MAX_PROMPT_CHARS = 4096  # a request's own `prompt`
BOM = "\ufeff"


@dataclass(frozen=True)
class Pair:
    """Two texts scored together by a cross-encoder: a query and a document."""

    query: str
    document: str


# One input: a text, token ids without special tokens (the model's special tokens are added around them), or a
# text pair (classification models: a cross-encoder's query and document).
Input = str | tuple[int, ...] | Pair


@dataclass(frozen=True)
class RequestError:
    """A request that gets no result: `status`, an error `type`, a message, and the parameter at fault."""

    status: int
    type: str
    message: str
    param: str | None = None


@dataclass(frozen=True)
class Meta:
    """What TorchServe tells about one request besides its body: Content-Type, `url_path`, request headers."""

    content_type: str | None = None
    url_path: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # names in lower case

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class Binary:
    """An answer of JSON followed by raw bytes (KServe v2's binary data extension)."""

    header: Any
    chunks: tuple[bytes, ...]


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the loaded model (from the config and the model itself)."""

    max_texts: int
    max_length: int
    vocab_size: int
    task: str = "embedding"
    dimensions: int = 0  # embedding size (embedding task) or number of labels (classification)
    prompts: tuple[tuple[str, str], ...] = ()  # the model's prompts by name (sentence-transformers' `prompts`)
    default_prompt: str | None = None  # the prompt's name used when a request names none
    model: Any = None  # what TEI's /info, /tokenize and /decode read (protocols.tei.ModelFacts)


OPTION_FIELDS = (
    "prompt_name",
    "prompt",
    "normalize",
    "dimensions",
    "raw_scores",
    "truncate",
    "truncation_direction",
    "input_type",
    "max_active_dims",
)
INPUT_TYPES = ("query", "document")  # sentence-transformers' encode_query / encode_document (absent: encode())
DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # encode_document's prompt: the first of these the model has
DIRECTIONS = ("right", "left")


def read_options(
    body: Mapping[str, Any], limits: Limits, fields: Sequence[str] = OPTION_FIELDS
) -> Options | RequestError:
    """The request's options among `fields` of `body`, checked; the prompt resolved against the model's prompts
    (none named and no `prompt`: the model's default prompt, if it has one)."""
    values: dict[str, Any] = {}
    for name in ("normalize", "raw_scores", "truncate"):
        value = body.get(name) if name in fields else None
        if value is not None and not isinstance(value, bool):
            return bad("InvalidType", f'"{name}" must be true or false, got {json_type(value)}', name)
        values[name] = value
    dimensions = body.get("dimensions") if "dimensions" in fields else None
    if dimensions is not None and (not is_int(dimensions) or not 1 <= dimensions <= limits.dimensions):
        return bad(
            "InvalidRequest",
            f'"dimensions" must be an integer from 1 to {limits.dimensions} (this model\'s '
            f"embedding size), got {quote(dimensions, 40)}",
            "dimensions",
        )
    direction = body.get("truncation_direction", "right") if "truncation_direction" in fields else "right"
    if direction not in DIRECTIONS:
        return bad(
            "InvalidRequest",
            f'"truncation_direction" must be "right" or "left", got {quote(direction, 40)}',
            "truncation_direction",
        )
    sparse = read_sparse_options(body, limits, fields, values["normalize"], dimensions)
    if isinstance(sparse, RequestError):
        return sparse
    input_type, max_active = sparse
    prompt_name = body.get("prompt_name") if "prompt_name" in fields else None
    text = body.get("prompt") if "prompt" in fields else None
    prompt = resolve_prompt(input_prompt(prompt_name, text, input_type, limits), text, limits, input_type)
    if isinstance(prompt, RequestError):
        return prompt
    return Options(
        values["normalize"],
        dimensions,
        bool(values["raw_scores"]),
        prompt,
        values["truncate"],
        direction,
        input_type,
        max_active,
    )


def read_sparse_options(
    body: Mapping[str, Any], limits: Limits, fields: Sequence[str], normalize: bool | None, dimensions: int | None
) -> tuple[str | None, int | None] | RequestError:
    """`input_type` ("query" | "document") and, for a sparse model, `max_active_dims`; a sparse model's answer is
    not normalised or cut to `dimensions` (sentence-transformers' SparseEncoder does neither)."""
    input_type = body.get("input_type") if "input_type" in fields else None
    if input_type is not None and input_type not in INPUT_TYPES:
        return bad(
            "InvalidRequest", f'"input_type" must be "query" or "document", got {quote(input_type, 40)}', "input_type"
        )
    kind = KINDS[limits.task]
    max_active = body.get("max_active_dims") if "max_active_dims" in fields else None
    if max_active is not None:
        if "max_active_dims" not in kind.options:
            return bad(
                "InvalidRequest",
                f'"max_active_dims" is for sparse models; this is an {limits.task} model',
                "max_active_dims",
            )
        if not is_int(max_active) or max_active < 1:
            return bad(
                "InvalidRequest",
                f'"max_active_dims" must be a positive integer, got {quote(max_active, 40)}',
                "max_active_dims",
            )
        if max_active > limits.dimensions:  # a CSR model's top-k over its latents cannot take more
            return bad(
                "InvalidRequest",
                f'"max_active_dims" must be at most {limits.dimensions}, the model\'s output size; got {max_active}',
                "max_active_dims",
            )
    if not kind.normalized and (normalize is not None or dimensions is not None):
        which = "normalize" if normalize is not None else "dimensions"
        return bad(
            "InvalidRequest",
            f'"{which}" is not served for a sparse model (its answer is the SparseEncoder\'s, neither normalised '
            'nor cut; use "max_active_dims")',
            which,
        )
    return input_type, max_active


def input_prompt(name: Any, text: Any, input_type: str | None, limits: Limits) -> Any:
    """The prompt name a request's input_type implies when it names none, as encode_query ("query") and
    encode_document (the first of document, passage, corpus) pick it among the model's prompts."""
    if name is not None or text is not None or input_type is None:
        return name
    prompts = dict(limits.prompts)
    candidates = ("query",) if input_type == "query" else DOCUMENT_PROMPTS
    return next((c for c in candidates if c in prompts), None)


def resolve_prompt(name: Any, text: Any, limits: Limits, input_type: str | None = None) -> str | RequestError:
    """The text to put before each input: the request's `prompt`, or the model's prompt `name`, or with an
    `input_type` the model's prompt of that name (none: no prompt, as encode_query/encode_document), or its default."""
    prompts = dict(limits.prompts)
    if input_type is not None and name is None and text is None:
        return prompts.get(input_type, "")
    if name is not None and text is not None:
        return bad("InvalidRequest", 'send "prompt_name" or "prompt", not both', "prompt")
    if text is not None:
        if not isinstance(text, str) or len(text) > MAX_PROMPT_CHARS:
            return bad("InvalidType", f'"prompt" must be a string of at most {MAX_PROMPT_CHARS} characters', "prompt")
        error = check_text(text, '"prompt"') if text.strip() else None  # a lone surrogate is the client's 400
        return RequestError(error.status, error.type, error.message, "prompt") if error else text
    if name is None:
        return prompts.get(limits.default_prompt, "") if limits.default_prompt else ""
    if not isinstance(name, str) or name not in prompts:
        known = ", ".join(quote(k, 40) for k in prompts) or "none (this model has no prompts)"
        return bad(
            "InvalidRequest",
            f'"prompt_name" {quote(name, 40)} is not a prompt of this model; its prompts: {known}',
            "prompt_name",
        )
    return prompts[name]


class Request(Protocol):
    """A parsed request: its inputs in order, its options, and how to answer them."""

    @property
    def inputs(self) -> Sequence[Input]: ...

    @property
    def options(self) -> Options: ...

    def where(self, index: int) -> str:
        """Names input `index` in an error message, in the request's own terms."""
        ...

    def render(self, answers: Sequence[Answer], model_name: str) -> Any:
        """The JSON answer body for one answer per input."""
        ...


def check_count(request: Request, answers: Sequence[Answer]) -> None:
    if len(answers) != len(request.inputs):
        raise ValueError(f"{len(request.inputs)} inputs but {len(answers)} answers")


def error_body(error: RequestError) -> dict[str, Any]:
    """The error body of our own protocol and of KServe v1/v2: `{"code", "type", "message"}`."""
    return {"code": error.status, "type": error.type, "message": error.message}


def bad(kind: str, message: str, param: str | None = None) -> RequestError:
    return RequestError(400, kind, message, param)


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """repr() of something a client sent, cut to `limit` characters (the rest only counted)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def names(keys: Sequence[Any]) -> str:
    """A few of the client's keys, quoted and cut, for a message."""
    shown = ", ".join(quote(str(k), 40) for k in list(keys)[:NAMES_SHOWN])
    return shown + (f" and {len(keys) - NAMES_SHOWN} more" if len(keys) > NAMES_SHOWN else "")


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_text(text: str, where: str) -> RequestError | None:
    """A text must hold something besides white space, and be encodable as UTF-8."""
    if not text.strip():
        return bad("EmptyText", f"{where} is empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return bad("InvalidEncoding", f"{where} holds a lone surrogate at character {e.start}")
    return None


def texts(value: Any, where: str, max_texts: int) -> tuple[str, ...] | RequestError:
    """A non-empty list of at most max_texts texts; errors name `where` and the index."""
    if not isinstance(value, list):
        return bad("InvalidType", f'"{where}" must be a list of strings, got {json_type(value)}', where)
    if not value:
        return bad("EmptyText", f'"{where}" is an empty list', where)
    if len(value) > max_texts:
        return too_many(len(value), where, max_texts)
    for i, t in enumerate(value):
        if not isinstance(t, str):
            return bad("InvalidType", f"{where}[{i}] must be a string, got {json_type(t)}", where)
        error = check_text(t, f"{where}[{i}]")
        if error:
            return error
    return tuple(value)


def pairs(value: Any, where: str, limits: Limits) -> tuple[Pair, ...] | RequestError:
    """A non-empty list of at most max_texts [query, document] pairs of texts, for a classification model."""
    if limits.task != "classification":
        return bad(
            "InvalidRequest",
            f'"{where}": text pairs need a classification model (a cross-encoder); this is an {limits.task} model',
            where,
        )
    if not isinstance(value, list):
        return bad("InvalidType", f'"{where}" must be a list of [query, document] pairs, got {json_type(value)}', where)
    if not value:
        return bad("EmptyText", f'"{where}" is an empty list', where)
    if len(value) > limits.max_texts:
        return too_many(len(value), where, limits.max_texts)
    out = []
    for i, pair in enumerate(value):
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(t, str) for t in pair):
            size = f" of {len(pair)} items" if isinstance(pair, list) else ""
            return bad(
                "InvalidType",
                f"{where}[{i}] must be a [query, document] pair of two strings, got {json_type(pair)}{size}",
                where,
            )
        error = check_text(pair[0], f"{where}[{i}][0]") or check_text(pair[1], f"{where}[{i}][1]")
        if error:
            return error
        out.append(Pair(pair[0], pair[1]))
    return tuple(out)


def too_many(count: int | None, where: str, max_texts: int) -> RequestError:
    """More than max_texts items; `count` None when they were not all counted (it stopped past the limit)."""
    has = f"{count} items" if count is not None else f"more than {max_texts} items"
    return RequestError(413, "TooManyTexts", f'"{where}" has {has}; at most {max_texts} per request', where)


def decode(row: Any, content_type: str | None) -> Any:
    """A request row's body as text or JSON (None when empty), or the error that stops it.

    The rule for JSON: a JSON Content-Type (`application/json`, `text/json`, `...+json`, any parameters) is
    parsed as JSON; any other `text/*` is always one text; a body sent with no Content-Type at all (Python
    `requests` with `data=`, httpx with `content=`) is parsed as JSON when it starts with `{`, and is one text
    otherwise. A leading UTF-8 byte-order mark is dropped first. A JSON envelope is never embedded as text.
    """
    if not isinstance(row, Mapping):
        return bad("InvalidRequest", f"unexpected request shape {type(row).__name__}")
    key = next((k for k in BODY_KEYS if k in row), None)
    if key is None:
        if row or "form" in (content_type or "").lower():
            return RequestError(
                415,
                "UnsupportedMediaType",
                "the body arrived as form fields (curl without -H 'Content-Type: ...' sends "
                "application/x-www-form-urlencoded); send it as text/plain or application/json",
            )
        return None
    value = row[key]
    if isinstance(value, (bytes, bytearray)):
        if not value:
            return None
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            return bad("InvalidEncoding", f"the body is not valid UTF-8 (byte {e.start}: {e.reason})")
    elif isinstance(value, str):  # TorchServe decodes a text/* body (text/json too) to a string itself
        text = value
    else:  # TorchServe parsed an application/json body itself
        return value
    text = text.removeprefix(BOM)  # a byte-order mark says how the body is encoded; it is not content
    ctype = (content_type or "").strip().lower()
    media = ctype.split(";", 1)[0].strip()
    sniffed = not ctype and text.lstrip()[:1] == "{"
    if not (media.endswith("/json") or media.endswith("+json") or sniffed):
        return text
    try:
        return json.loads(text)
    except ValueError as e:  # JSONDecodeError, or an integer too long to convert
        if not isinstance(e, json.JSONDecodeError):
            return bad(
                "InvalidJSON",
                f"the body is not valid JSON here: it holds an integer of more than "
                f"{sys.get_int_max_str_digits()} digits",
            )
        hint = (
            " (no Content-Type was sent and the body starts with '{', so it was read as JSON; "
            "send Content-Type: text/plain to embed it as text)"
            if sniffed
            else ""
        )
        return bad("InvalidJSON", f"the body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}{hint}")


_SNAKE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake(name: str) -> str:
    """`TooManyTexts` -> `too_many_texts`, `InvalidJSON` -> `invalid_json`."""
    return _SNAKE.sub("_", name).lower()
