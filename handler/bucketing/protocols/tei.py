"""What Text Embeddings Inference's routes share (not a wire format itself): its error shape and status codes,
its `inputs` field, and the model facts its `/info`, `/tokenize` and `/decode` read (`model_facts`, built once per
worker from its settings, task and tokenizer).

TEI answers an error as `{"error": message, "error_type": Validation | Tokenizer | Backend | Overloaded |
Unhealthy | Empty}` with the status its type implies (router/src/http/server.rs): 422 Validation (a malformed
request, too many inputs, a text over the model's length with truncation off), 400 Empty (an empty batch), 424
Backend (the model cannot do this: `/embed` on a classifier). `own_error` maps our errors to those; a server fault
keeps its 5xx (type Backend), an answer over max_response_bytes its 413 and a form body its 415; a text over
max_length with truncation off is TEI's 422 (our other routes' 413). The helpers below raise the client's mistake,
as every parser does; `validation`, `empty`, `backend` and `too_many` make the error to raise.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from bucketing.answers import Options
from bucketing.config import OVERFLOW_RULES
from bucketing.protocols.base import Input, Limits, RequestError, error_of, json_type
from bucketing.protocols.inputs import check_text
from bucketing.protocols.options import late_refused, read_options

if TYPE_CHECKING:
    from bucketing.config import HandlerConfig
    from bucketing.kinds.task import Task
    from bucketing.model.tokenizer import Tokenizer

VERSION = "0.2.0"  # this package's version, answered as /info's `version`
STATUS = {"Validation": 422, "Tokenizer": 422, "Backend": 424, "Overloaded": 429, "Unhealthy": 503, "Empty": 400}
KEPT = ("ResponseTooLarge", "UnsupportedMediaType")  # their 413 and 415 are TEI's too: kept, typed Validation
POOLING_NAMES = {"lasttoken": "last_token"}  # TEI's name where it differs from sentence-transformers'
# /info's pooling for a model that pools no tokens (a multi-vector model: one vector per token, /embed_all). TEI has
# no such model type; its `pooling` is a free string, and "none" tells a client there is no one vector a text.
NO_POOLING = "none"


def error_body(error: RequestError) -> dict[str, Any]:
    """TEI's error shape."""
    return {"error": error.message, "error_type": error.type}


def own_error(error: RequestError) -> RequestError:
    """Our error as TEI types it: its own types kept; a route the model cannot serve a 424 Backend; a client's
    mistake a 422 Validation (but 413 and 415, which TEI answers too); a server fault a Backend error that stays
    a 5xx."""
    if error.type in STATUS:
        return error
    if error.type == "NotFound":  # a route this model cannot serve (/rerank on a three-label model): TEI's 424
        return error_of(STATUS["Backend"], "Backend", error.message, error.param)
    if error.status >= 500:
        return error_of(error.status, "Backend", error.message, error.param)
    if error.type in KEPT:
        return error_of(error.status, "Validation", error.message, error.param)
    return error_of(STATUS["Validation"], "Validation", error.message, error.param)


@contextmanager
def own_errors() -> Iterator[None]:
    """An error raised within, raised again as TEI types it (`own_error`)."""
    try:
        yield
    except RequestError as e:
        raise own_error(e) from None


def validation(message: str, param: str | None = None) -> RequestError:
    return error_of(STATUS["Validation"], "Validation", message, param)


def empty(field: str) -> RequestError:
    """TEI's answer to an empty batch."""
    return error_of(STATUS["Empty"], "Empty", f"`{field}` cannot be empty", field)


def backend(message: str) -> RequestError:
    """The model cannot serve this route (TEI's 424)."""
    return error_of(STATUS["Backend"], "Backend", message)


def refused_here(what: str, limits: Limits) -> RequestError:
    """A model this TEI route does not answer (TEI's 424): `what` it is not, and the TEI route that serves it."""
    kind = limits.kind
    route = (
        "/embed_sparse (TEI's sparse route)"
        if kind.sparse
        else "/predict (TEI's classification route)"
        if kind.classifier
        else "/embed_all (TEI's token-embeddings route)"
        if kind.per_token
        else "/embed (TEI's embed route)"
    )
    return backend(f"{what}: this is {kind.a_model}, served at {route}")


def too_many(count: int, limits: Limits) -> RequestError:
    """TEI's message for a batch over max_client_batch_size (handler.max_texts_per_request)."""
    return validation(
        f"batch size {count} > maximum allowed batch size {limits.max_texts} (handler.max_texts_per_request)",
        "inputs",
    )


def body_object(body: Any, fields: str) -> Mapping[str, Any]:
    """The request as a JSON object; raises TEI's validation error."""
    if body is None:
        raise validation(f"the request has no body; send JSON {{{fields}}}")
    if not isinstance(body, Mapping):
        raise validation(f"expected a JSON object {{{fields}}}, got a JSON {json_type(body)}")
    return body


def with_inputs(body: Any) -> Mapping[str, Any]:
    """The request as a JSON object holding `inputs`; raises TEI's validation error."""
    request = body_object(body, '"inputs": ...')
    if "inputs" not in request:
        raise validation("missing field `inputs`", "inputs")
    late = late_refused(request, "TEI's API")  # TEI tolerates unknown fields: these would be ignored, silently
    if late:
        raise validation(late[1], late[0])
    if "precision" in request:  # TEI tolerates unknown fields: this one would be ignored, silently
        raise validation(
            "`precision` is not a TEI field: TEI answers float embeddings; binary embeddings are served in our JSON "
            'at POST /predictions/NAME ({"texts": [...], "precision": ...}) and KServe v2',
            "precision",
        )
    if "outputs" in request:  # TEI tolerates unknown fields: this one would be ignored, silently
        raise validation(
            "`outputs` is not a TEI field: a BGE-M3 model's dense output is TEI's /embed, its sparse one "
            "/embed_sparse, its ColBERT vectors /embed_all; all three in one answer: our JSON at POST "
            '/predictions/NAME ({"texts": [...], "outputs": [...]})',
            "outputs",
        )
    return request


def texts(value: Any, limits: Limits, field: str = "inputs") -> tuple[tuple[str, ...], bool]:
    """TEI's `inputs`: a string (single) or a list of strings (a batch); and whether it was a single one. Token ids
    are refused here: TEI sends them as they are (no special tokens added), which OpenAI's route does not."""
    if isinstance(value, str):
        with own_errors():
            check_text(value, f"`{field}`")
        return (value,), True
    if not isinstance(value, list):
        raise validation(f"`{field}` must be a string or a list of strings, got {json_type(value)}", field)
    if not value:
        raise empty(field)
    if len(value) > limits.max_texts:
        raise too_many(len(value), limits)
    for i, text in enumerate(value):
        if not isinstance(text, str):
            what = "token ids are served at v1/embeddings (OpenAI's route)" if isinstance(text, (int, list)) else ""
            raise validation(
                f"{field}[{i}] must be a string, got {json_type(text)}{'; ' + what if what else ''}", field
            )
        with own_errors():
            check_text(text, f"{field}[{i}]")
    return tuple(value), False


@dataclass(frozen=True)
class TeiInputs:
    """A TEI request's inputs (one, or a list) and options; each route's request adds its own `render`."""

    inputs: tuple[Input, ...]
    options: Options = Options()
    single: bool = False

    def where(self, index: int) -> str:
        return "`inputs`" if self.single else f"inputs[{index}]"


Request = TypeVar("Request", bound=TeiInputs)


def parse_texts(kind: type[Request], body: Any, limits: Limits, fields: Sequence[str]) -> Request:
    """A body that must be an object holding `inputs` (a string or a list of strings) and options among `fields`,
    read into `kind`; raises TEI's error."""
    request = with_inputs(body)
    parsed = texts(request["inputs"], limits)
    with own_errors():
        options = read_options(direction(request), limits, fields)
    return kind(parsed[0], options, parsed[1])


def direction(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """TEI also spells `truncation_direction` "Left"/"Right"; our options read the lower case."""
    value = body.get("truncation_direction")
    if value in ("Left", "Right"):
        return {**body, "truncation_direction": value.lower()}
    return body


class TextTools(Protocol):
    """The tokenizer as `/tokenize` and `/decode` use it."""

    def tokenize(self, text: str, add_special_tokens: bool) -> list[dict[str, Any]]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str: ...


@dataclass(frozen=True)
class ModelFacts:
    """What TEI's `/info`, `/tokenize` and `/decode` tell or use, from the handler's settings and model."""

    dtype: str
    # an embedding model's pooling modes (empty: pools none, a multi-vector model); None: a classifier
    pooling: tuple[str, ...] | None
    labels: tuple[str, ...] | None  # a classifier's labels, in id order
    max_batch_tokens: int
    auto_truncate: bool
    max_chars: int  # the longest text /tokenize reads (the tokenizer's own bound on what one text costs)
    tools: TextTools

    def model_type(self) -> dict[str, Any]:
        """TEI's `model_type`: `{"embedding": {"pooling"}}` (`none` for a model that pools no tokens),
        `{"classifier": ...}`, or `{"reranker": ...}` (one label, as TEI calls a one-label classifier)."""
        if self.labels is None and self.pooling == ():
            return {"embedding": {"pooling": NO_POOLING}}
        if self.labels is None:
            pooling = "+".join(POOLING_NAMES.get(p, p) for p in self.pooling or ("mean",))
            return {"embedding": {"pooling": pooling}}
        labels = {
            "id2label": {str(i): label for i, label in enumerate(self.labels)},
            "label2id": {label: i for i, label in enumerate(self.labels)},
        }
        return {"reranker" if len(self.labels) == 1 else "classifier": labels}


class BackendTools:
    """`TextTools` over a Hugging Face `tokenizers.Tokenizer` (the one the handler tokenizes with: truncating at
    max_length, so /tokenize shows the tokens the model sees). Offsets are UTF-8 byte offsets, as TEI's."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def tokenize(self, text: str, add_special_tokens: bool) -> list[dict[str, Any]]:
        encoding = self.backend.encode(text, add_special_tokens=add_special_tokens)
        at = byte_offsets(text)
        tokens = []
        for id_, token, special, (start, stop) in zip(
            encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets
        ):
            if special:
                tokens.append({"id": id_, "text": token, "special": True, "start": None, "stop": None})
            else:
                piece = {"id": id_, "text": text[start:stop], "special": False, "start": at[start], "stop": at[stop]}
                tokens.append(piece)
        return tokens

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))


def byte_offsets(text: str) -> list[int]:
    """For each character position of `text` (and its end), the UTF-8 byte offset there."""
    out = [0]
    for ch in text:
        out.append(out[-1] + len(ch.encode("utf-8", "surrogatepass")))
    return out


def model_facts(config: HandlerConfig, task: Task, tokenizer: Tokenizer) -> ModelFacts:
    """What TEI's /info, /tokenize and /decode read of a worker: its settings, the model's kind, and its tokenizer."""
    chain = task.chain
    labels = task.labels
    return ModelFacts(
        dtype=config.dtype,
        pooling=None if labels is not None else (chain.pooling if chain is not None else ("mean",)),
        labels=tuple(labels) if labels is not None else None,
        max_batch_tokens=config.max_batch_tokens,
        auto_truncate=OVERFLOW_RULES[config.on_overflow][0],
        max_chars=tokenizer.max_cut_chars,
        tools=BackendTools(tools_backend(tokenizer, config.max_length)),
    )


def tools_backend(tokenizer: Tokenizer, max_length: int) -> Any:
    """The tokenizer TEI's /tokenize and /decode use: the one the handler cuts texts with, or, where a task reads
    texts past max_length (`task.reach`: a sparse Router's static route), a copy of it cut at max_length (the tokens
    the transformer sees)."""
    backend = tokenizer._backend  # noqa: SLF001 - the one tokenizer, as it cuts texts
    if tokenizer.max_length == max_length:
        return backend
    copy = type(backend).from_str(backend.to_str())
    copy.enable_truncation(max_length)
    return copy
