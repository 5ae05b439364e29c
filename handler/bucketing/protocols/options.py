"""A request's options, read and checked once for every wire format: the prompt (the request's own, one the model
names, or the one its `input_type` implies), normalize, dimensions, raw_scores, truncation, and a sparse model's
`input_type` and `max_active_dims`; a bad option raises the client's mistake. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bucketing.answers import Options
from bucketing.model.chain import INPUT_TYPES
from bucketing.protocols.base import Limits, RequestError, bad, is_int, json_type, quote
from bucketing.protocols.inputs import check_text
from bucketing.quantize import PRECISIONS, RANGES_FILE

MAX_PROMPT_CHARS = 4096  # a request's own `prompt`
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
    "precision",
)
DIRECTIONS = ("right", "left")


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
    input_type, max_active = read_sparse_options(body, limits, fields, values["normalize"], dimensions)
    prompt_name = body.get("prompt_name") if "prompt_name" in fields else None
    text = body.get("prompt") if "prompt" in fields else None
    prompt = resolve_prompt(prompt_name, text, limits, input_type)
    precision = read_precision(body.get("precision") if "precision" in fields else None, limits)
    return Options(
        values["normalize"],
        dimensions,
        bool(values["raw_scores"]),
        prompt,
        values["truncate"],
        direction,
        input_type,
        max_active,
        precision,
        limits.ranges if PRECISIONS[precision].ranged else None,
    )


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
