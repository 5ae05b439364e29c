"""What holds across wire formats: every format registered once with its routes, answers bounded and capped
(413), error codes in snake case, request errors (one exception per status, raised and made the request's outcome),
the fields an answer holds, logits turned into scores by the model's activation."""

from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pytest

from bucketing import protocols
from bucketing.answers import Answer, Options, activate
from bucketing.model_kinds import MODEL_KINDS, answer_fields
from bucketing.protocols import native, openai
from bucketing.protocols.base import (
    ERRORS,
    BadRequest,
    Limits,
    NotFound,
    Request,
    RequestError,
    TooLarge,
    Unprocessable,
    Wire,
    bad,
    error_of,
    snake,
)
from bucketing.protocols.kserve_v1 import V1Request
from bucketing.protocols.kserve_v2 import V2Request
from bucketing.protocols.native import TextRequest
from bucketing.protocols.openai import EmbeddingsRequest
from bucketing.protocols.tei import STATUS as TEI_STATUS
from tests.unit.wire import JSON, answer, incoming


def test_every_wire_format_is_registered_once_with_its_routes():
    tei = {"embed", "predict", "similarity", "tokenize", "decode", "info", "embed_sparse", "embed_all"}
    assert set(protocols.ROUTES) == {"", "v1/embeddings", "v1/models", "rerank", "v1/rerank", "v2/embed", *tei}
    for wire in protocols.WIRES:
        assert wire.served in protocols.SERVED and callable(wire.error_body)
    assert incoming({}, JSON, url_path="v1/nope").wire is openai.WIRE  # a 404 in the shape of its neighbours


def test_a_wire_format_is_declared_once_and_answers_errors_in_its_own_shape():
    assert len({w.name for w in protocols.WIRES}) == len(protocols.WIRES)
    assert all(w.claims is None or w.claimed is not None for w in protocols.WIRES)
    with pytest.raises(ValueError, match="claims"):
        Wire("x", {}, None, "x", error_body=lambda e: {}, claims=lambda body: True)  # a claim with no parser
    plain = Wire("plain", {}, None, "served", error_body=lambda e: {"message": e.message})
    reply = plain.error_reply(NotFound("NotFound", "nope"))  # no own_error: the error as raised
    assert (reply.status, reply.error, json.loads(reply.body)) == (404, "NotFound", {"message": "nope"})
    assert not plain.claims_body({"inputs": "a"}) and plain.refusal(MODEL_KINDS["multivector"]) is None


def test_an_answer_over_the_response_cap_is_a_413():
    request = TextRequest(("a", "b"), False)
    reply = protocols.Incoming(native.WIRE, request).reply([answer([0.5] * 300)] * 2, "m", 1024)
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


def test_a_request_error_is_an_exception_whose_class_is_its_status():
    error = bad("InvalidType", '"text" must be a string', "text")
    assert isinstance(error, BadRequest) and isinstance(error, Exception) and error.status == 400
    assert (error.type, error.message, error.param) == ("InvalidType", '"text" must be a string', "text")
    assert error == BadRequest("InvalidType", '"text" must be a string', "text") and len({error, copy.copy(error)}) == 1
    assert error != TooLarge("InvalidType", '"text" must be a string', "text")  # another status: another error
    assert error != BadRequest("InvalidType", '"text" must be a string') and error != "InvalidType"
    assert repr(error) == "BadRequest('InvalidType', '\"text\" must be a string', param='text')"
    assert pickle.loads(pickle.dumps(error)) == error
    moved = error.with_param("input")
    assert moved == BadRequest("InvalidType", '"text" must be a string', "input") and error.param == "text"
    used = {400, 404, 413, 415, 422, 500, *TEI_STATUS.values()}  # ours, and TEI's by error type
    assert sorted(ERRORS) == sorted(used) == [400, 404, 413, 415, 422, 424, 429, 500, 503]
    for status, kind in ERRORS.items():
        made = error_of(status, "T", "m", "p")
        assert type(made) is kind and made.status == status == kind.status and made == kind("T", "m", "p")
    assert error_of(422, "Validation", "m") == Unprocessable("Validation", "m")


def test_a_recorded_error_keeps_no_traceback():
    """An error made a request's outcome holds no frames (their locals: the batch) once it is caught."""
    try:
        try:
            raise ValueError("inner")
        except ValueError:
            raise NotFound("NotFound", "nope") from None
    except RequestError as caught:
        failed = protocols.Incoming(native.WIRE, TextRequest(("a",), True)).fail(caught)
    outcome = failed.outcome
    assert isinstance(outcome, NotFound) and outcome == NotFound("NotFound", "nope") and failed.request is None
    assert outcome.__traceback__ is None and outcome.__context__ is None
    assert incoming({"text": 1}, JSON).outcome.__traceback__ is None  # as protocols.parse records one
    reply = failed.reply([], "m", 10**6)
    assert (reply.status, json.loads(reply.body)) == (404, {"code": 404, "type": "NotFound", "message": "nope"})


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


def test_a_models_truncate_dim_cuts_after_normalising_and_a_request_re_normalises():
    """sentence-transformers' truncate_dim cuts the normalised vector (no re-normalising); a request's
    `dimensions` or `normalize` is OpenAI's cut / encode(normalize_embeddings=True): normalised after the cut."""
    values = np.array([3.0, 4.0, 12.0], dtype=np.float32)
    answer = Answer(values, 3, False, normalize=True, truncate_dim=2)
    assert np.allclose(answer.vector(), [3 / 13, 4 / 13])
    assert np.allclose(answer.vector(dimensions=2), [0.6, 0.8]) and np.allclose(
        answer.vector(normalize=True), [0.6, 0.8]
    )
    assert np.allclose(answer.vector(dimensions=1), [1.0]) and np.allclose(answer.vector(normalize=False), [3, 4])
    assert np.allclose(Answer(values, 3, False, truncate_dim=2).vector(), [3, 4])  # no Normalize: the cut alone
    assert answer.fields(Options(precision="binary"))["embedding"] == [64]  # bits 11: 192 - 128


def test_dimensions_above_a_models_truncate_dim_is_one_line():
    from bucketing.protocols.base import Limits, RequestError

    limits = Limits(max_texts=4, max_length=16, vocab_size=10, dimensions=384, truncate_dim=128)
    assert limits.read_dimensions(128) == 128 and limits.read_dimensions(None) is None
    with pytest.raises(RequestError) as raised:
        limits.read_dimensions(129)
    line = (
        '"dimensions" must be an integer from 1 to 128 (this model\'s truncate_dim; its embedding size is 384), got 129'
    )
    assert raised.value.message == line and raised.value.param == "dimensions"
