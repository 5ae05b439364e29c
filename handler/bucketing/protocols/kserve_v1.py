"""KServe v1 at `/v1/models/NAME:predict`: `{"instances": ["...", {"text": "..."}]}`, answered `{"predictions"}`.

An optional top-level `"parameters"` object carries our options (`precision`, `prompt_name`, `dimensions`, ...) as
a v2 request's `parameters` does. Other top-level fields are tolerated (KServe clients may add some), as in v2.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bucketing.answers import Answer, Options
from bucketing.model_kinds import ONE_PER_INPUT, KindName
from bucketing.protocols.base import Limits, Wire, bad, check_count, json_type
from bucketing.protocols.base import error_body as error_body
from bucketing.protocols.inputs import texts
from bucketing.protocols.options import read_options

NAME = "kserve-v1"
ANSWERS: tuple[KindName, ...] | None = ONE_PER_INPUT  # not a multi-vector model
SERVED = 'POST /v1/models/NAME:predict (KServe v1 {"instances"})'
ROUTES: dict[str, Any] = {}  # reached at the plain predictions path; its body is claimed (`claims`)


@dataclass(frozen=True)
class V1Request:
    inputs: tuple[str, ...]
    options: Options = Options()  # from `parameters`, where given; else the model's default prompt, if it has one

    def where(self, index: int) -> str:
        return f"instances[{index}]"

    def render(self, answers: Sequence[Answer], model_name: str = "") -> Any:
        check_count(self, answers)
        return {"predictions": [a.fields(self.options) for a in answers]}


def claims(body: Any) -> bool:
    """Whether a body at the plain predictions path is a v1 request."""
    return isinstance(body, Mapping) and "instances" in body


def parse(body: Any, limits: Limits) -> V1Request:
    if not isinstance(body, Mapping) or "instances" not in body:
        raise bad("InvalidRequest", f'expected a JSON object with "instances", got a JSON {json_type(body)}')
    instances = body["instances"]
    if not isinstance(instances, list):
        raise bad("InvalidType", f'"instances" must be a list, got {json_type(instances)}', "instances")
    unwrapped = [i["text"] if isinstance(i, Mapping) and set(i) == {"text"} else i for i in instances]
    parsed = texts(unwrapped, "instances", limits.max_texts)
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise bad("InvalidType", f'"parameters" must be an object, got {json_type(parameters)}', "parameters")
    return V1Request(parsed, read_options(parameters, limits))


WIRE = Wire(
    name=NAME,
    routes=ROUTES,
    answers=ANSWERS,
    served=SERVED,
    error_body=error_body,
    claims=claims,
    claimed=parse,
)
