"""Text Embeddings Inference's `/predict` at `/predictions/NAME/VERSION/predict`, for a classification model.

Request: `{"inputs", "raw_scores"?, "truncate"?, "truncation_direction"?}`, `inputs` as TEI reads it: a string,
or `[a]`, or a pair `[a, b]` (one input), or a batch of those as lists `[[a], [a, b], ...]`. Answer: per input
the labels as `[{"label", "score"}]`, best score first (the model's activation, or its logits with
`raw_scores`): a list of them for one input, a list of such lists for a batch. Errors in TEI's shape (`tei.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bucketing.answers import Answer, Options
from bucketing.model_kinds import ONE_PER_INPUT, KindName
from bucketing.protocols import tei
from bucketing.protocols.base import Input, Limits, Pair, Wire, check_count, json_type
from bucketing.protocols.inputs import check_text
from bucketing.protocols.options import read_options
from bucketing.protocols.tei import error_body as error_body
from bucketing.protocols.tei import own_error as own_error

NAME = "tei-predict"
ANSWERS: tuple[KindName, ...] | None = ONE_PER_INPUT  # not a multi-vector model
PATH = "predict"
SERVED = f"POST /predictions/NAME/VERSION/{PATH} (TEI's predict, classification models)"
FIELDS = ("raw_scores", "truncate", "truncation_direction")
SHAPE = "a string, a pair [string, string] or a batch of strings and pairs [[string], [string, string], ...]"


@dataclass(frozen=True)
class PredictRequest(tei.TeiInputs):
    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        ranked = [predictions(a, self.options) for a in answers]
        return ranked[0] if self.single else ranked


def predictions(answer: Answer, options: Options) -> list[dict[str, Any]]:
    """One input's labels with their scores, best first."""
    fields = answer.fields(options)
    labels = answer.labels or ()
    scores = fields["scores"] if "scores" in fields else {labels[0]: fields["score"]}
    ranked = sorted(scores.items(), key=lambda item: -item[1])
    return [{"score": score, "label": label} for label, score in ranked]


def sequence(value: Any, where: str) -> Input:
    """`[a]` (one text) or `[a, b]` (a pair), each a non-empty string."""
    if not isinstance(value, list) or not 1 <= len(value) <= 2 or not all(isinstance(t, str) for t in value):
        size = f" of {len(value)} items" if isinstance(value, list) else ""
        raise tei.validation(f"{where} must be {SHAPE}; got {json_type(value)}{size}", "inputs")
    for i, text in enumerate(value):
        with tei.own_errors():
            check_text(text, f"{where}[{i}]")
    return value[0] if len(value) == 1 else Pair(value[0], value[1])


def inputs(value: Any, limits: Limits) -> tuple[tuple[Input, ...], bool]:
    """TEI's PredictInput: one input (a string, [a] or [a, b]) or a batch of lists; and whether it was one."""
    if isinstance(value, str):
        return tei.texts(value, limits)[0], True
    if not isinstance(value, list):
        raise tei.validation(f"`inputs` must be {SHAPE}; got {json_type(value)}", "inputs")
    if not value:
        raise tei.empty("inputs")
    if isinstance(value[0], str):
        return (sequence(value, "`inputs`"),), True
    if len(value) > limits.max_texts:
        raise tei.too_many(len(value), limits)
    batch = []
    for i, item in enumerate(value):
        batch.append(sequence(item, f"inputs[{i}]"))
    return tuple(batch), False


def parse(body: Any, limits: Limits) -> PredictRequest:
    if not limits.kind.classifier:
        raise tei.refused_here("Model is not a classifier model", limits)
    request = tei.with_inputs(body)
    parsed = inputs(request["inputs"], limits)
    with tei.own_errors():
        options = read_options(tei.direction(request), limits, FIELDS)
    return PredictRequest(parsed[0], options, parsed[1])


ROUTES = {PATH: parse}

WIRE = Wire(name=NAME, routes=ROUTES, answers=ANSWERS, served=SERVED, error_body=error_body, own_error=own_error)
