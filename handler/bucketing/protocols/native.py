"""Our own protocol at `/predictions/NAME`: a text/plain body, `{"text": ...}` or `{"texts": [...]}`; for a
classification model (a cross-encoder) also text pairs, `{"text": q, "text_pair": p}` or `{"pairs": [[q, p]]}`.

A single text is answered with one object, a `texts` list with a list in the same order. Options: `prompt_name`
(one of the model's prompts) or `prompt` (text put before each input), `normalize`, `dimensions`, `input_type`
("query" | "document": as encode_query/encode_document), and for classifiers `raw_scores` (logits instead of
scores), `on_overflow` ("chunk": a long text pooled over windows, its answer saying `chunks`), and late chunking
(`"chunking": "late"` with `"spans"`: each text's answer is `{"chunks": [{"span", "embedding"}, ...], "tokens",
"truncated"}`). A multi-vector model answers `{"embeddings": [[...], ...], "tokens", "truncated"}` per text. Unknown
fields are refused (a typo is a 400 naming it, never a silently different request).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bucketing.answers import Answer, Options
from bucketing.model_kinds import KindName
from bucketing.protocols.base import Limits, Pair, Wire, bad, check_count, json_type, names
from bucketing.protocols.base import error_body as error_body
from bucketing.protocols.body import Text
from bucketing.protocols.inputs import check_text, pairs, texts
from bucketing.protocols.options import OPTION_FIELDS, read_options

NAME = "native"
ANSWERS: tuple[KindName, ...] | None = None  # the model kinds it answers: every kind
SERVED = (
    'POST /predictions/NAME[/VERSION]: JSON {"text"} or {"texts"}, a classifier\'s {"text", "text_pair"} or '
    '{"pairs"}, text/plain, and KServe v1/v2 bodies'
)


@dataclass(frozen=True)
class TextRequest:
    """One text or pair (answered with one object), or a `texts` or `pairs` list (answered with a list)."""

    inputs: tuple[str, ...] | tuple[Pair, ...]
    single: bool
    options: Options = Options()  # prompt, normalize, dimensions, raw_scores
    key: str = "texts"  # what a list came as: texts or pairs

    def where(self, index: int) -> str:
        if self.single:
            return "the pair" if isinstance(self.inputs[0], Pair) else "the text"
        return f"{self.key}[{index}]"

    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        fields = [a.fields(self.options) for a in answers]
        return fields[0] if self.single else fields


def parse(body: Any, limits: Limits) -> TextRequest:
    """A decoded body (text, or JSON) to texts; raises the client's mistake."""
    if body is None:
        raise bad("EmptyBody", 'the request has no body; send a text or JSON {"text": ...}')
    if isinstance(body, Text):
        single = _single(body, "the body")
        return replace(single, options=read_options({}, limits))  # text/plain: the model's default prompt, if any
    if not isinstance(body, Mapping):
        raise bad(
            "InvalidRequest",
            f'expected a JSON object {{"text": ...}} or {{"texts": [...]}}, got a JSON {json_type(body)}'
            + (" (one text alone is sent as the body with Content-Type: text/plain)" if isinstance(body, str) else ""),
        )
    parsed = _texts(body, set(body) - set(OPTION_FIELDS), limits)
    return replace(parsed, options=read_options(body, limits))


def _texts(body: Mapping[str, Any], keys: set[Any], limits: Limits) -> TextRequest:
    if keys == {"text", "text_pair"}:
        return TextRequest(pairs([[body["text"], body["text_pair"]]], "text_pair", limits), single=True)
    if keys == {"pairs"}:
        return TextRequest(pairs(body["pairs"], "pairs", limits), single=False, key="pairs")
    if keys == {"text"}:
        if not isinstance(body["text"], str):
            raise bad("InvalidType", f'"text" must be a string, got {json_type(body["text"])}', "text")
        return _single(body["text"], '"text"')
    if keys == {"texts"}:
        return TextRequest(texts(body["texts"], "texts", limits.max_texts), single=False)
    if not keys:
        raise bad("InvalidRequest", 'the JSON object is empty; expected {"text": ...} or {"texts": [...]}')
    unknown = sorted(str(k) for k in keys - {"text", "texts", "text_pair", "pairs"})
    if unknown:
        raise bad(
            "InvalidRequest",
            f'unknown field(s) {names(unknown)}; expected "text" or "texts" (a '
            f'classifier: "text" and "text_pair", or "pairs"; and {", ".join(OPTION_FIELDS)})',
        )
    raise bad(
        "InvalidRequest",
        'send "text" or "texts", not both (a classifier also takes "text" with "text_pair", or "pairs")',
    )


def _single(text: str, where: str) -> TextRequest:
    check_text(text, where)
    return TextRequest((text,), single=True)


ROUTES = {"": parse}

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body)
