"""A request's options, read and checked once for every wire format: the prompt (the request's own, one the model
names, or the one its `input_type` implies), normalize, dimensions, raw_scores, truncation, and a sparse model's
`input_type` and `max_active_dims`; a bad option raises the client's mistake. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bucketing.answers import Options
from bucketing.config import OVERFLOW, OVERFLOW_RULES
from bucketing.model.chain import INPUT_TYPES
from bucketing.protocols.base import Limits, RequestError, bad, is_int, json_type, quote
from bucketing.protocols.inputs import check_text
from bucketing.protocols.outputs import FIELDS as OUTPUT_FIELDS
from bucketing.protocols.outputs import read_outputs
from bucketing.quantize import PRECISIONS, RANGES_FILE

MAX_PROMPT_CHARS = 4096  # a request's own `prompt`
OPTION_FIELDS = (
    "prompt_name",
    "prompt",
    "normalize",
    "dimensions",
    "raw_scores",
    "truncate",
    "on_overflow",
    "chunking",
    "spans",
    "truncation_direction",
    "input_type",
    "max_active_dims",
    "precision",
    *OUTPUT_FIELDS,  # a multi-output model's (BGE-M3): `protocols.outputs`
)
DIRECTIONS = ("right", "left")
SENTENCES = "sentences"  # late chunking's spans: the text's sentences (`chunks.sentences`)


def read_options(body: Mapping[str, Any], limits: Limits, fields: Sequence[str] = OPTION_FIELDS) -> Options:
    """The request's options among `fields` of `body`, checked; the prompt resolved against the model's prompts
    (none named and no `prompt`: the model's default prompt, if it has one)."""
    values: dict[str, Any] = {}
    for name in ("normalize", "raw_scores", "truncate"):
        value = body.get(name) if name in fields else None
        if value is not None and not isinstance(value, bool):
            raise bad("InvalidType", f'"{name}" must be true or false, got {json_type(value)}', name)
        values[name] = value
    dimensions = limits.read_dimensions(body.get("dimensions")) if "dimensions" in fields else None
    direction = body.get("truncation_direction", "right") if "truncation_direction" in fields else "right"
    if direction not in DIRECTIONS:
        raise bad(
            "InvalidRequest",
            f'"truncation_direction" must be "right" or "left", got {quote(direction, 40)}',
            "truncation_direction",
        )
    truncate, chunk = read_overflow(body.get("on_overflow") if "on_overflow" in fields else None, values, limits)
    spans = read_spans(body, fields, limits, chunk)
    if spans is not None and direction == "left":
        raise bad(
            "InvalidRequest",
            'truncation_direction "left" is not served with late chunking (one pass over a text\'s first tokens)',
            "truncation_direction",
        )
    input_type, max_active = read_sparse_options(body, limits, fields, values["normalize"], dimensions)
    prompt_name = body.get("prompt_name") if "prompt_name" in fields else None
    text = body.get("prompt") if "prompt" in fields else None
    prompt = resolve_prompt(prompt_name, text, limits, input_type)
    precision = read_precision(body.get("precision") if "precision" in fields else None, limits)
    outputs, sparse_tokens = read_outputs(body, limits, fields)
    options = Options(
        values["normalize"],
        dimensions,
        bool(values["raw_scores"]),
        prompt,
        truncate,
        chunk,
        direction,
        input_type,
        max_active,
        precision,
        limits.ranges if PRECISIONS[precision].ranged else None,
        spans,
        outputs,
        sparse_tokens,
    )
    if PRECISIONS[precision].ranged:
        check_cut_ranges(precision, options, limits)
    return options


def check_cut_ranges(
    precision: str, options: Options, limits: Limits, what: str = "precision", name: str = "dimensions"
) -> None:
    """A ranged precision of a cut that is then re-normalised needs ranges of that cut, derived from the calibration
    vectors the model's ranges file keeps (`quantize.Ranges`); a file without them (written before they were kept)
    answers the uncut vector's ranges only: the client's 400, in one line, rather than clipped values."""
    ranges = limits.ranges
    cut = options.dimensions if options.dimensions is not None else (limits.truncate_dim if options.normalize else None)
    if ranges is None or ranges.calibration is not None or cut is None or cut >= limits.dimensions:
        return
    if options.normalize is False:
        return
    raise bad(
        "InvalidRequest",
        f'"{what}" {precision} with "{name}" {cut} (re-normalised) needs ranges of that cut; this model\'s '
        f'{RANGES_FILE} keeps only the uncut vector\'s (no calibration "embeddings"): compute it again with '
        "python -m model_store.ranges MODEL_DIR --texts FILE, and build the archive again",
        name if options.dimensions is not None else "precision",
    )


def read_overflow(value: Any, values: Mapping[str, Any], limits: Limits) -> tuple[bool | None, bool]:
    """`on_overflow` ("truncate" | "reject" | "chunk"), or `truncate` (true | false), as (truncate, chunk); absent:
    (None, False), `handler.on_overflow` decides. Both at once is the client's 400; so is "chunk" where the model
    cannot pool windows (`Limits.chunking`)."""
    if value is None:
        return values["truncate"], False
    if values["truncate"] is not None:
        raise bad("InvalidRequest", 'send "on_overflow" or "truncate", not both', "on_overflow")
    if not isinstance(value, str) or value not in OVERFLOW:
        raise bad(
            "InvalidRequest",
            f'"on_overflow" must be one of {", ".join(map(repr, OVERFLOW))}, got {quote(value, 40)}',
            "on_overflow",
        )
    cut, chunk = OVERFLOW_RULES[value]
    if chunk and limits.chunking:
        raise bad("InvalidRequest", f'"on_overflow" "chunk" {limits.chunking}', "on_overflow")
    return (None if chunk else cut), chunk


def read_spans(body: Mapping[str, Any], fields: Sequence[str], limits: Limits, chunk: bool) -> Any:
    """Late chunking: `"chunking": "late"` with `"spans"`, "sentences" or one text's [[start, end], ...] character
    spans (0 <= start < end, at most `max_length` of them); None without it. Where the model cannot, or with
    `on_overflow: chunk`, the client's 400."""
    mode = body.get("chunking") if "chunking" in fields else None
    spans = body.get("spans") if "spans" in fields else None
    if mode is None:
        if spans is not None:
            raise bad("InvalidRequest", '"spans" is for late chunking: send it with "chunking": "late"', "spans")
        return None
    if mode != "late":
        raise bad("InvalidRequest", f'"chunking" must be "late", got {quote(mode, 40)}', "chunking")
    if limits.late:
        raise bad("InvalidRequest", f'"chunking" "late" {limits.late}', "chunking")
    if chunk:
        raise bad("InvalidRequest", 'send "chunking": "late" or "on_overflow": "chunk", not both', "chunking")
    if spans == SENTENCES:
        return SENTENCES
    pairs = spans if isinstance(spans, list) else None
    if not pairs or len(pairs) > limits.max_length or not all(_span(p) for p in pairs):
        raise bad(
            "InvalidRequest",
            f'"spans" must be "sentences" or a list of 1 to {limits.max_length} [start, end] character offsets '
            f"(integers, 0 <= start < end), got {quote(spans, 60)}",
            "spans",
        )
    return tuple((int(a), int(b)) for a, b in pairs)


LATE_FIELDS = ("chunking", "spans")  # what a format answering one vector per input refuses (`late_refused`)


def late_refused(body: Mapping[str, Any], wire: str) -> tuple[str, str] | None:
    """The field and line refusing late chunking in a format whose answer holds one vector per input (which would
    otherwise ignore the field, silently); None when the body has none."""
    name = next((n for n in LATE_FIELDS if n in body), None)
    if name is None:
        return None
    return name, (
        f'"{name}" (late chunking: one vector per span) is not served by {wire}, whose answer holds one vector per '
        'input; send it in our JSON at POST /predictions/NAME ({"texts": [...], "chunking": "late", "spans": ...})'
    )


def _span(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(is_int(x) for x in value) and 0 <= value[0] < value[1]


def chunked(options: Options, limits: Limits) -> bool:
    """Whether a text over max_length is split into windows: as the request says, else as `handler.on_overflow`."""
    return options.chunk or (options.truncate is None and OVERFLOW_RULES[limits.on_overflow][1])


def ranges_missing(name: str) -> str:
    """Why a ranged precision (int8, uint8) is refused by a model that stores no ranges: one wording, every format."""
    return (
        f"{name} needs per-dimension ranges fixed for the model (sentence-transformers takes them from the batch it "
        f"is given, which would make an answer depend on its batch); this model stores none ({RANGES_FILE}: build "
        'it with --calibration-texts FILE): ask "binary", "ubinary" or "float"'
    )


def read_precision(value: Any, limits: Limits) -> str:
    """A dense embedding's `precision` (absent: "float"); one a model cannot answer exactly is the client's 400."""
    if value is None:
        return "float"
    if not isinstance(value, str) or value not in PRECISIONS:
        raise bad(
            "InvalidRequest",
            f'"precision" must be one of {", ".join(map(repr, PRECISIONS))}, got {quote(value, 40)}',
            "precision",
        )
    if not limits.kind.dense_vector:
        raise bad("InvalidRequest", f'"precision" is for dense embeddings; this is {limits.kind.a_model}', "precision")
    if PRECISIONS[value].ranged and limits.ranges is None:
        raise bad("InvalidRequest", f'"precision" {ranges_missing(value)}', "precision")
    return value


def read_sparse_options(
    body: Mapping[str, Any], limits: Limits, fields: Sequence[str], normalize: bool | None, dimensions: int | None
) -> tuple[str | None, int | None]:
    """`input_type` ("query" | "document") and, for a sparse model, `max_active_dims`; a sparse model's answer is
    not normalised or cut to `dimensions` (sentence-transformers' SparseEncoder does neither)."""
    input_type = body.get("input_type") if "input_type" in fields else None
    if input_type is not None and input_type not in INPUT_TYPES:
        raise bad(
            "InvalidRequest", f'"input_type" must be "query" or "document", got {quote(input_type, 40)}', "input_type"
        )
    kind = limits.kind
    max_active = body.get("max_active_dims") if "max_active_dims" in fields else None
    if max_active is not None:
        if "max_active_dims" not in kind.options:
            raise bad(
                "InvalidRequest",
                f'"max_active_dims" is for sparse models; this is {kind.a_model}',
                "max_active_dims",
            )
        if not is_int(max_active) or max_active < 1:
            raise bad(
                "InvalidRequest",
                f'"max_active_dims" must be a positive integer, got {quote(max_active, 40)}',
                "max_active_dims",
            )
        if max_active > limits.dimensions:  # a CSR model's top-k over its latents cannot take more
            raise bad(
                "InvalidRequest",
                f'"max_active_dims" must be at most {limits.dimensions}, the model\'s output size; got {max_active}',
                "max_active_dims",
            )
    if not kind.normalized and (normalize is not None or dimensions is not None):
        which = "normalize" if normalize is not None else "dimensions"
        raise bad(
            "InvalidRequest",
            f'"{which}" is not served for a sparse model (its answer is the SparseEncoder\'s, neither normalised '
            'nor cut; use "max_active_dims")',
            which,
        )
    return input_type, max_active


def resolve_prompt(name: Any, text: Any, limits: Limits, input_type: str | None = None) -> str:
    """The text to put before each input: the request's `prompt`, or the model's prompt `name`, or with an
    `input_type` the model's prompt of that name (none: no prompt), or its default. sentence-transformers 6.2 always
    has a `query` and a `document` prompt (empty unless set; a kind's `role_prompts`), so encode_query /
    encode_document take exactly those, never a `passage` or `corpus` prompt nor the default one, and naming one the
    model does not save is no prompt."""
    prompts = dict(limits.prompts)
    prompts.update({role: "" for role in limits.kind.role_prompts if role not in prompts})
    if input_type is not None and name is None and text is None:
        return prompts.get(input_type, "")
    if name is not None and text is not None:
        raise bad("InvalidRequest", 'send "prompt_name" or "prompt", not both', "prompt")
    if text is not None:
        if not isinstance(text, str) or len(text) > MAX_PROMPT_CHARS:
            raise bad("InvalidType", f'"prompt" must be a string of at most {MAX_PROMPT_CHARS} characters', "prompt")
        if text.strip():  # a lone surrogate is the client's 400
            try:
                check_text(text, '"prompt"')
            except RequestError as e:
                raise e.with_param("prompt") from None
        return text
    if name is None:
        return prompts.get(limits.default_prompt, "") if limits.default_prompt else ""
    if not isinstance(name, str) or name not in prompts:
        known = ", ".join(quote(k, 40) for k in prompts) or "none (this model has no prompts)"
        raise bad(
            "InvalidRequest",
            f'"prompt_name" {quote(name, 40)} is not a prompt of this model; its prompts: {known}',
            "prompt_name",
        )
    return prompts[name]
