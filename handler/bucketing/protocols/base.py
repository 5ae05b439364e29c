"""What every wire format shares: the parsed request's types (inputs, limits, request metadata), its errors (one
exception per HTTP status), one input's answer check, the error body, and safe quoting of what a client sent.

Pure: no torch, no I/O. A wire format (native, KServe v1/v2, OpenAI, TEI's routes) is a `Wire`, declared once
as its module's `WIRE`: its routes, each with a parser `(body, limits) -> Request` (raising a `RequestError` for the
client's mistake), the kinds it answers, and its error shape; see `protocols/__init__.py`, which turns a raised
error into the request's outcome. Reading a request's body is `body`, its inputs `inputs`, its options `options`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from bucketing.answers import Answer, Options
from bucketing.model_kinds import MODEL_KINDS, Kind, KindName
from bucketing.quantize import Ranges


def plain(value: Any) -> Any:
    """An array in an answer (BGE-M3's ColBERT vectors stay one array up to their wire format, which packs it whole
    into binary tensors) as the lists its `tolist` gives: the JSON it was before."""
    tolist = getattr(value, "tolist", None)
    if tolist is None:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    return tolist()


try:  # an answer's JSON: orjson where installed (requirements.txt pins it), else json at ~20x its cost per float
    import orjson

    def dumps(value: Any) -> bytes:
        """An answer body as JSON bytes (values parse back as `json.dumps` writes them; UTF-8, not escaped)."""
        return orjson.dumps(value, default=plain, option=orjson.OPT_NON_STR_KEYS)

except ImportError:  # pragma: no cover - orjson is in requirements.txt and the image

    def dumps(value: Any) -> bytes:
        """An answer body as JSON bytes (values parse back as `json.dumps` writes them; UTF-8, not escaped)."""
        return json.dumps(value, ensure_ascii=False, default=plain).encode()


QUOTE_CHARS = 100  # at most this much of anything a client sent is quoted back in an error message
NAMES_SHOWN = 5  # at most this many unknown keys are named in one message


@dataclass(frozen=True)
class Pair:
    """Two texts scored together by a cross-encoder: a query and a document."""

    query: str
    document: str


# One input: a text, token ids without special tokens (the model's special tokens are added around them), or a
# text pair (classification models: a cross-encoder's query and document).
Input = str | tuple[int, ...] | Pair


class RequestError(Exception):
    """A request that gets no result, raised where it is found and answered at one boundary (`protocols.parse`, the
    pipeline's per-request loop): its class's HTTP `status`, an error `type`, a message, and the parameter at fault.
    Raise one of its subclasses (one per status); `error_of` picks the subclass of a status."""

    status: ClassVar[int]

    def __init__(self, type: str, message: str, param: str | None = None) -> None:
        super().__init__(type, message, param)
        self.type = type
        self.message = message
        self.param = param

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, type(self)) or type(other) is not type(self):  # the same class, not a subclass
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((type(self), *self._fields()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.type!r}, {self.message!r}, param={self.param!r})"

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.message}"

    def _fields(self) -> tuple[str, str, str | None]:
        return self.type, self.message, self.param

    def with_param(self, param: str | None) -> RequestError:
        """The same error (status, type, message) naming another parameter."""
        return type(self)(self.type, self.message, param)

    def detached(self) -> RequestError:
        """This error kept as a request's outcome: without the traceback and chained errors that would hold the
        frames which raised it (and the batch they saw) alive."""
        self.__traceback__ = self.__context__ = self.__cause__ = None
        return self


class BadRequest(RequestError):
    status = 400


class NotFound(RequestError):
    status = 404


class TooLarge(RequestError):
    status = 413


class UnsupportedMediaType(RequestError):
    status = 415


class Unprocessable(RequestError):
    status = 422  # TEI's Validation and Tokenizer errors


class FailedDependency(RequestError):
    status = 424  # TEI's Backend: the model cannot serve this route


class TooManyRequests(RequestError):
    status = 429  # TEI's Overloaded


class ServerError(RequestError):
    status = 500


class Unavailable(RequestError):
    status = 503  # TEI's Unhealthy


ERRORS: dict[int, type[RequestError]] = {
    cls.status: cls
    for cls in (
        BadRequest,
        NotFound,
        TooLarge,
        UnsupportedMediaType,
        Unprocessable,
        FailedDependency,
        TooManyRequests,
        ServerError,
        Unavailable,
    )
}


def error_of(status: int, type: str, message: str, param: str | None = None) -> RequestError:
    """The error of this HTTP status (one of `ERRORS`)."""
    return ERRORS[status](type, message, param)


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
    ranges: Ranges | None = None  # a dense model's fixed int8/uint8 ranges (`quantize.RANGES_FILE`), if any
    chunking: str | None = None  # why `on_overflow: chunk` is not served (the rest of a line); None: it is
    on_overflow: str = "truncate"  # `handler.on_overflow`: what a request that says nothing gets
    chunk_reach: int = 0  # `on_overflow: chunk`: the most token ids one input may hold (its windows' reach)
    late: str | None = None  # why late chunking is not served (the rest of a line); None: it is
    truncate_dim: int | None = None  # a dense model's own cut (sentence-transformers' truncate_dim), if any

    @property
    def kind(self) -> Kind:
        """The loaded model's kind (what a wire format asks of it: `kinds.Kind`)."""
        return MODEL_KINDS[self.task]

    def read_dimensions(self, value: Any, name: str = "dimensions", mark: str = '"') -> int | None:
        """A request's `dimensions` (or its format's name for it): absent, None; else an integer from 1 to the
        model's truncate_dim (a model cut there is asked no more), else to its embedding size; else the client's
        400, in one line."""
        if value is None:
            return None
        top = self.truncate_dim or self.dimensions
        if not is_int(value) or not 1 <= value <= top:
            why = (
                f"this model's truncate_dim; its embedding size is {self.dimensions}"
                if self.truncate_dim
                else "this model's embedding size"
            )
            line = f"{mark}{name}{mark} must be an integer from 1 to {top} ({why}), got {quote(value, 40)}"
            raise bad("InvalidRequest", line, name)
        return int(value)


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


Parser = Callable[[Any, Limits], Request]  # a route's parser: raises the client's mistake (a `RequestError`)


@dataclass(frozen=True)
class Reply:
    """One request's HTTP answer: status, body, its content type and extra headers (and the error type, if any)."""

    status: int
    body: str | bytes
    error: str | None = None
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    answer_ms: float = 0.0  # what rendering and encoding it took (set by the pipeline; `bucket_answer_ms_total`)


def as_raised(error: RequestError) -> RequestError:
    """An error as it was raised (a wire format with no error types of its own)."""
    return error


@dataclass(frozen=True, eq=False)
class Wire:
    """One wire format, declared once (its module's `WIRE`): how requests reach it and how it answers them.

    `routes`: the paths it serves after `/predictions/NAME/VERSION/`, each with its parser (`""`: the plain path);
    `answers`: the model kinds it answers (None: every kind); `served`: what it serves, for the 404 that lists
    everything; `error_body`: its error shape; `claims` (with `claimed`, its parser): whether a body at the plain
    path is its own; `own_error`: an error as the format types it, status included (TEI's 422 Validation).
    """

    name: str
    routes: Mapping[str, Parser]
    answers: tuple[KindName, ...] | None
    served: str
    error_body: Callable[[RequestError], Any]
    claims: Callable[[Any], bool] | None = None
    claimed: Parser | None = None  # the parser of a body it claims
    own_error: Callable[[RequestError], RequestError] = as_raised

    def __post_init__(self) -> None:
        if (self.claims is None) != (self.claimed is None):
            raise ValueError(f"wire format {self.name}: a claim on a body comes with its parser (claims, claimed)")

    def __repr__(self) -> str:
        return f"Wire({self.name!r})"

    def serves(self, kind: Kind) -> bool:
        """Whether it answers this kind: the one admission check (`answers`; None: every kind)."""
        return self.answers is None or kind.name in self.answers

    def refusal(self, kind: Kind) -> str | None:
        """Its line for a kind it does not answer (the kind's `wire_refusal`); None when it answers it."""
        return None if self.serves(kind) else kind.wire_refusal.format(wire=self.name)

    def admit(self, kind: Kind) -> None:
        """Raises its refusal of this model's kind, when it does not answer it (`serves`)."""
        line = self.refusal(kind)
        if line is not None:
            raise bad("InvalidRequest", line)

    def claims_body(self, body: Any) -> bool:
        """Whether a body at the plain path is its own (`claims`; then `claimed` parses it)."""
        return self.claims is not None and self.claims(body)

    def error_reply(self, error: RequestError) -> Reply:
        """An error answered in this format: typed as it types errors (`own_error`), in its shape (`error_body`)."""
        error = self.own_error(error)
        return Reply(error.status, json.dumps(self.error_body(error)), error.type)


def error_body(error: RequestError) -> dict[str, Any]:
    """The error body of our own protocol and of KServe v1/v2: `{"code", "type", "message"}`."""
    return {"code": error.status, "type": error.type, "message": error.message}


def bad(kind: str, message: str, param: str | None = None) -> BadRequest:
    """The client's mistake (a 400), to raise."""
    return BadRequest(kind, message, param)


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


_SNAKE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake(name: str) -> str:
    """`TooManyTexts` -> `too_many_texts`, `InvalidJSON` -> `invalid_json`."""
    return _SNAKE.sub("_", name).lower()
