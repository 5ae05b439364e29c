"""What holds across wire formats: every format registered once with its routes, answers bounded and capped
(413), error codes in snake case, the fields an answer holds, logits turned into scores by the model's activation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bucketing import protocols
from bucketing.answers import Answer, Options, activate
from bucketing.kinds import answer_fields
from bucketing.protocols import native, openai
from bucketing.protocols.base import Limits, Request, snake
from bucketing.protocols.kserve_v1 import V1Request
from bucketing.protocols.kserve_v2 import V2Request
from bucketing.protocols.native import TextRequest
from bucketing.protocols.openai import EmbeddingsRequest
from tests.unit.wire import JSON, answer, incoming


def test_every_wire_format_is_registered_once_with_its_routes():
    tei = {"embed", "predict", "similarity", "tokenize", "decode", "info", "embed_sparse", "embed_all"}
    assert set(protocols.ROUTES) == {"", "v1/embeddings", "v1/models", "rerank", "v1/rerank", *tei}
    for wire in protocols.WIRES:
        assert wire.SERVED in protocols.SERVED and callable(wire.error_body)
    assert incoming({}, JSON, url_path="v1/nope").wire is openai  # a 404 in the shape of its neighbours


def test_an_answer_over_the_response_cap_is_a_413():
    request = TextRequest(("a", "b"), False)
    reply = protocols.Incoming(native, request).reply([answer([0.5] * 100)] * 2, "m", 1024)
    assert reply.status == 413 and json.loads(reply.body)["type"] == "ResponseTooLarge"


@pytest.mark.parametrize("labels", [None, ("negative", "neutral", "positive")])
def test_largest_answer_bounds_every_wire_format(labels):
    rng = np.random.default_rng(0)
    dims = 8 if labels is None else len(labels)
    limits = Limits(max_texts=5, max_length=16, vocab_size=1000, task="embedding", dimensions=dims)
    values = [(-rng.random(dims) * 1e-5).astype(np.float32) for _ in range(5)]  # long reprs: -1.2345678e-06
    answers = [Answer(v, 512, True, labels) for v in values]
    requests: list[Request] = [
        TextRequest(("x",) * 5, False),
        V1Request(("x",) * 5),
        V2Request(("x",) * 5, "id"),
        EmbeddingsRequest(("x",) * 5, model="m" * 256),
    ]
    bound = protocols.largest_answer(limits, labels)
    for request in requests if labels is None else requests[:3]:
        assert len(json.dumps(request.render(answers, "model-name"))) <= bound


def test_snake_case_codes():
    assert [snake(t) for t in ("TooManyTexts", "InvalidJSON", "EmptyText", "NotFound")] == [
        "too_many_texts",
        "invalid_json",
        "empty_text",
        "not_found",
    ]


def test_answer_fields_name_what_answers_hold():
    assert tuple(answer([1.0]).fields()) == answer_fields("embedding")
    assert tuple(answer([0.4, 0.6], labels=("a", "b")).fields()) == answer_fields("classification", 2)
    assert (
        tuple(answer([0.4], labels=("a",)).fields())
        == answer_fields("classification", 1)
        == ("score", "tokens", "truncated")
    )


@pytest.mark.parametrize(
    ("activation", "expected"),
    [
        ("softmax", [0.0900306, 0.2447285, 0.6652409]),
        ("sigmoid", [0.7310586, 0.8807971, 0.9525741]),
        ("identity", [1.0, 2.0, 3.0]),
    ],
)
def test_logits_become_scores_by_the_model_activation(activation, expected):
    fields = answer([1.0, 2.0, 3.0], labels=("a", "b", "c"), activation=activation).fields()
    assert fields["label"] == "c" and np.allclose(list(fields["scores"].values()), expected, atol=1e-6)
    raw = answer([1.0, 2.0, 3.0], labels=("a", "b", "c"), activation=activation).fields(Options(raw_scores=True))
    assert list(raw["scores"].values()) == [1.0, 2.0, 3.0]
    assert activate([-800.0, 800.0], "sigmoid") == [0.0, 1.0]  # no overflow at the extremes
