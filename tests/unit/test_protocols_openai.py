"""OpenAI's /v1/embeddings and /v1/models (texts and token ids in, float or base64 out, mistakes naming their
parameter) and Cohere's /v1/rerank beside them."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from bucketing.answers import Options
from bucketing.protocols import native, openai
from bucketing.protocols.base import Limits, RequestError, snake
from bucketing.protocols.openai import EmbeddingsRequest, ModelsRequest
from tests.unit.wire import CLASSIFIER, JSON, answer, incoming


@pytest.mark.parametrize(
    "body, inputs",
    [
        ({"input": "hello"}, ("hello",)),
        ({"input": ["a", "b"], "model": "m", "user": "u"}, ("a", "b")),
        ({"input": [1, 2, 3]}, ((1, 2, 3),)),
        ({"input": [[1, 2], [3]]}, ((1, 2), (3,))),
        ({"input": "x", "extra_option": True}, ("x",)),
    ],
)
def test_openai_inputs(body, inputs):
    result = incoming(body, JSON, "v1/embeddings")
    assert result.wire is openai.WIRE and result.outcome.inputs == inputs


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({}, "input", "'input' is a required property"),
        ({"input": ""}, "input", "'input' is empty"),
        ({"input": []}, "input", "empty array"),
        ({"input": 5}, "input", "a string or an array"),
        ({"input": ["a", 1]}, "input", "input[1] must be a string"),
        ({"input": [[1], "a"]}, "input", "input[1] must be a non-empty array of token ids"),
        ({"input": [[1], []]}, "input", "(empty)"),
        ({"input": [1, 1000]}, "input", "input[1] = 1000 is not a token id"),
        ({"input": [[1], [-1]]}, "input", "input[1][0] = -1"),
        ({"input": [[1, True]]}, "input", "must be a token id"),
        ({"input": ["a"] * 5}, "input", "at most 4"),
        ({"input": "a", "encoding_format": "hex"}, "encoding_format", "'float' or 'base64'"),
        ({"input": "a", "dimensions": 0}, "dimensions", "from 1 to 4"),
        ({"input": "a", "dimensions": 5}, "dimensions", "from 1 to 4"),
        ({"input": "a", "model": 3}, "model", "'model' must be a string"),
    ],
)
def test_openai_mistakes_name_the_parameter(body, param, words):
    result = incoming(body, JSON, "v1/embeddings")
    error = result.outcome
    assert isinstance(error, RequestError) and 400 <= error.status < 500 and words in error.message
    reply = json.loads(result.reply([], "m", 10**6).body)
    assert reply["error"]["param"] == param and reply["error"]["message"] == error.message
    assert reply["error"]["type"] == "invalid_request_error" and reply["error"]["code"] == snake(error.type)


def test_openai_render_float_base64_and_dimensions():
    answers = [answer([0.6, 0.8, 0.0, 0.0], tokens=4), answer([0.0, 0.0, 3.0, 4.0], tokens=5)]
    body = EmbeddingsRequest(("a", "b"), model="asked").render(answers, "served")
    assert body["object"] == "list" and body["model"] == "asked"
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    assert [d["index"] for d in body["data"]] == [0, 1] and body["data"][0]["object"] == "embedding"
    assert np.allclose(body["data"][1]["embedding"], [0.0, 0.0, 3.0, 4.0])
    encoded = EmbeddingsRequest(("a", "b"), encoding_format="base64").render(answers, "served")
    assert encoded["model"] == "served"
    decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(decoded, np.array([0.6, 0.8, 0.0, 0.0], dtype=np.float32))
    normalized = [answer([0.6, 0.8, 0.0, 0.0], normalize=True), answer([0.0, 0.0, 3.0, 4.0], normalize=True)]
    short = EmbeddingsRequest(("a", "b"), options=Options(dimensions=2)).render(normalized, "m")
    assert np.allclose(short["data"][0]["embedding"], [0.6, 0.8]) and short["data"][1]["embedding"] == [0.0, 0.0]
    three = EmbeddingsRequest(("b",), options=Options(dimensions=3)).render(normalized[1:], "m")["data"][0]["embedding"]
    assert np.allclose(three, [0.0, 0.0, 1.0])
    raw = EmbeddingsRequest(("b",), options=Options(normalize=False)).render(normalized[1:], "m")["data"][0]
    assert np.allclose(raw["embedding"], [0.0, 0.0, 3.0, 4.0])  # a request may ask for the vector unnormalised


def test_openai_models_and_unknown_paths():
    listing = incoming(b"", None, "v1/models")
    assert isinstance(listing.outcome, ModelsRequest)
    assert json.loads(listing.reply([], "minilm", 10**6).body)["data"][0]["id"] == "minilm"
    lost = incoming({"input": "x"}, JSON, "v1/chat/completions")
    assert lost.outcome.status == 404 and "v1/embeddings" in lost.outcome.message
    assert json.loads(lost.reply([], "m", 10**6).body)["error"]["code"] == "not_found"
    other = incoming({"text": "x"}, JSON, "/somewhere/")
    assert other.wire is native.WIRE and json.loads(other.reply([], "m", 10**6).body)["code"] == 404


def test_openai_embeddings_on_a_classifier_is_a_404_saying_what_is_served():
    classifier = Limits(4, 16, 1000, "classification", 3)
    result = incoming({"input": "x"}, JSON, "v1/embeddings", limits=classifier)
    assert result.outcome.status == 404 and "classification model" in result.outcome.message


def test_openai_token_ids_cut_on_the_left_keep_and_check_the_last_ones():
    left = {"truncation_direction": "left"}
    ids = [10**9] * 1000 + list(range(1, 18))  # the last 16 are kept (and one more, that tells they were cut)
    request = incoming({"input": ids, **left}, JSON, url_path="v1/embeddings").outcome
    assert isinstance(request, EmbeddingsRequest) and request.inputs == (tuple(range(1, 18)),)
    for wrong, index in (([5] * 20 + [-1] + [5] * 15, 20), ([5] * 30 + [1000], 30)):
        for body in ({"input": wrong, **left}, {"input": [[5], wrong], **left}):
            error = incoming(body, JSON, url_path="v1/embeddings").outcome
            assert error.status == 400 and f"[{index}] = {wrong[index]} is not a token id" in error.message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([True], "input[0] must be a string, a token id or an array of token ids, got boolean"),
        ([None, "a"], "input[0] must be a string, a token id or an array of token ids, got null"),
        ([[1], True], "input[1] must be a non-empty array of token ids like input[0], got boolean"),
        ([1, "a"], "input[1] must be a token id (an integer), got string"),
    ],
)
def test_openai_input_type_messages_say_what_is_wrong(value, message):
    error = incoming({"input": value}, JSON, url_path="v1/embeddings").outcome
    assert error.status == 400 and error.message == message


def test_cohere_documents_may_be_objects_and_top_n_is_checked():
    from bucketing.protocols import cohere_rerank
    from bucketing.protocols.base import Pair

    ok = incoming({"query": "q", "documents": [{"text": "a"}, "b"]}, JSON, url_path="v1/rerank", limits=CLASSIFIER)
    assert ok.wire is cohere_rerank.WIRE and ok.outcome.inputs == (Pair("q", "a"), Pair("q", "b"))
    bad = incoming({"query": "q", "documents": ["a"], "top_n": 0}, JSON, url_path="v1/rerank", limits=CLASSIFIER)
    assert bad.outcome.param == "top_n" and json.loads(bad.reply([], "m", 10**6).body)["error"]["param"] == "top_n"
