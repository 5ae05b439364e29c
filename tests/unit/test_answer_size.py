"""An answer's least size, known from its numbers before it is rendered (`answers.least_bytes`), never exceeds what
it renders to, in any wire format and precision: a request refused on it would never have fitted."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from bucketing.answers import least_bytes
from bucketing.protocols.base import Limits, RequestError
from bucketing.quantize import PRECISIONS, Ranges
from tests.unit.wire import JSON, answer, incoming, v2

LIMITS = Limits(8, 16, 1000, "embedding", 4, ranges=Ranges(np.array([[-1.0] * 4, [1.0] * 4], dtype=np.float32)))
BODIES = {
    "native": ({"texts": ["a", "b", "c"]}, None, "precision"),
    "openai": ({"input": ["a", "b", "c"], "model": "m"}, "v1/embeddings", None),
    "openai-base64": ({"input": ["a", "b", "c"], "model": "m", "encoding_format": "base64"}, "v1/embeddings", None),
    "kserve-v2": (v2(["a", "b", "c"]), None, "parameters"),
    "kserve-v2-binary": (
        v2(["a", "b", "c"], outputs=[{"name": "embedding", "parameters": {"binary_data": True}}]),
        None,
        "parameters",
    ),
    "tei": ({"inputs": ["a", "b", "c"]}, "embed", None),
}


@pytest.mark.parametrize("wire", sorted(BODIES))
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
@pytest.mark.parametrize("values", [[0.0, 0.0, 0.0, 0.0], [0.5, -0.25, 1.0, 0.0], [1e-7, -3.3e-5, 0.123456, -0.9]])
def test_the_least_size_is_never_more_than_the_rendered_answer(wire, precision, values):
    body, path, where = BODIES[wire]
    if precision != "float":
        if where is None:
            pytest.skip(f"{wire} answers float only")
        body = {**body, "precision": precision} if where == "precision" else {**body, where: {"precision": precision}}
    request = incoming(json.loads(json.dumps(body)), JSON, url_path=path, limits=LIMITS)
    assert not isinstance(request.outcome, RequestError), request.outcome
    answers = [replace(answer(values), normalize=False)] * 3
    reply = request.reply(answers, "m", 10**9)
    assert reply.status == 200
    assert 0 < least_bytes(answers, request.outcome.options) <= len(reply.body)
    assert request.reply(answers, "m", least_bytes(answers, request.outcome.options) - 1).status == 413
