"""Our own protocol at `/predictions/NAME`: a text/plain body, `{"text": ...}` or `{"texts": [...]}`.

A single text is answered with one object, a `texts` list with a list in the same order. Options: `prompt_name`
(one of the model's prompts) or `prompt` (text put before each input), `normalize`, `dimensions`, and for
classifiers `raw_scores` (logits instead of scores). Unknown fields are refused (a typo is a 400 naming it,
never a silently different request).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .base import (
    OPTION_FIELDS,
    Answer,
    Limits,
    Options,
    RequestError,
    bad,
    check_count,
    check_text,
    json_type,
    names,
    read_options,
    texts,
)
from .base import error_body as error_body

NAME = "native"


@dataclass(frozen=True)
class TextRequest:
    """One text (answered with one object) or a `texts` list (answered with a list)."""

    inputs: tuple[str, ...]
    single: bool
    options: Options = Options()  # prompt, normalize, dimensions, raw_scores

    def where(self, index: int) -> str:
        return "the text" if self.single else f"texts[{index}]"

    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        fields = [a.fields(self.options) for a in answers]
        return fields[0] if self.single else fields


def parse(body: Any, limits: Limits) -> TextRequest | RequestError:
    """A decoded body (text, or JSON) to texts, or the client's mistake."""
    if body is None:
        return bad("EmptyBody", 'the request has no body; send a text or JSON {"text": ...}')
    if isinstance(body, str):
        single = _single(body, "the body")
        options = read_options({}, limits)  # a text/plain body: the model's default prompt, if any
        if isinstance(single, RequestError) or isinstance(options, RequestError):
            return single if isinstance(single, RequestError) else options
        return replace(single, options=options)
    if not isinstance(body, Mapping):
        return bad(
            "InvalidRequest",
            f'expected a JSON object {{"text": ...}} or {{"texts": [...]}}, got a JSON {json_type(body)}',
        )
    parsed = _texts(body, set(body) - set(OPTION_FIELDS), limits)
    if isinstance(parsed, RequestError):
        return parsed
    options = read_options(body, limits)
    return options if isinstance(options, RequestError) else replace(parsed, options=options)


def _texts(body: Mapping[str, Any], keys: set[Any], limits: Limits) -> TextRequest | RequestError:
    if keys == {"text"}:
        if not isinstance(body["text"], str):
            return bad("InvalidType", f'"text" must be a string, got {json_type(body["text"])}', "text")
        return _single(body["text"], '"text"')
    if keys == {"texts"}:
        many = texts(body["texts"], "texts", limits.max_texts)
        return many if isinstance(many, RequestError) else TextRequest(many, single=False)
    if not keys:
        return bad("InvalidRequest", 'the JSON object is empty; expected {"text": ...} or {"texts": [...]}')
    unknown = sorted(str(k) for k in keys - {"text", "texts"})
    if unknown:
        return bad("InvalidRequest", f'unknown field(s) {names(unknown)}; expected "text" or "texts" (and '
                   f"{', '.join(OPTION_FIELDS)})")  # fmt: skip
    return bad("InvalidRequest", 'send either "text" or "texts", not both')


def _single(text: str, where: str, limits: Limits | None = None) -> TextRequest | RequestError:
    return check_text(text, where) or TextRequest((text,), single=True)
