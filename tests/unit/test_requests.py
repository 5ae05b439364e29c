"""Request parsing: every accepted shape, and a clear 4xx naming the problem for each client mistake."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bucketing.requests import RequestError, TextRequest, V1Request, V2Request, parse_request, parse_value

JSON = "application/json"


def parse(body, content_type=None, max_texts=4):
    return parse_request({"body": body}, content_type, max_texts)


@pytest.mark.parametrize(
    "body, content_type, texts, single",
    [
        (b"hello world", "text/plain", ("hello world",), True),
        ("already decoded", "text/plain", ("already decoded",), True),
        ({"text": "one"}, JSON, ("one",), True),
        ({"texts": ["a", "b"]}, JSON, ("a", "b"), False),
        (b'{"texts": ["a"]}', "application/json; charset=utf-8", ("a",), False),
        (b'{"text": "caf\\u00e9"}', "application/json", ("caf\u00e9",), True),
        ("caf\u00e9 \u6f22\u5b57 \U0001f600".encode(), "text/plain", ("caf\u00e9 \u6f22\u5b57 \U0001f600",), True),
        (b'{"text": "x"}', None, ('{"text": "x"}',), True),  # without a JSON type, a body is one text
    ],
)
def test_accepted_shapes(body, content_type, texts, single):
    assert parse(body, content_type) == TextRequest(texts, single)


def test_data_key_is_accepted_like_body():
    assert parse_request({"data": b"hi"}, None, 4) == TextRequest(("hi",), True)


@pytest.mark.parametrize(
    "row, content_type, status, kind, words",
    [
        ({"body": b""}, None, 400, "EmptyBody", "empty"),
        ({}, None, 400, "EmptyBody", "no body"),
        ({"hello world": b""}, "application/x-www-form-urlencoded", 415, "UnsupportedMediaType", "form"),
        ({}, "application/x-www-form-urlencoded", 415, "UnsupportedMediaType", "Content-Type"),
        ({"body": b"   \n"}, "text/plain", 400, "EmptyText", "the body is empty"),
        ({"body": {"text": ""}}, JSON, 400, "EmptyText", '"text" is empty'),
        ({"body": b'{"text": '}, JSON, 400, "InvalidJSON", "line 1 column 10"),
        ({"body": b"\xff\xfe"}, "text/plain", 400, "InvalidEncoding", "UTF-8"),
        ({"body": {"text": 5}}, JSON, 400, "InvalidType", "got number"),
        ({"body": {"texts": "abc"}}, JSON, 400, "InvalidType", "list of strings, got string"),
        ({"body": {"texts": ["a", None]}}, JSON, 400, "InvalidType", "texts[1] must be a string, got null"),
        ({"body": {"texts": ["a", " "]}}, JSON, 400, "EmptyText", "texts[1] is empty"),
        ({"body": {"texts": []}}, JSON, 400, "EmptyText", "empty list"),
        ({"body": {"texts": ["a"] * 5}}, JSON, 413, "TooManyTexts", "at most 4"),
        ({"body": {"text": "a", "texts": ["b"]}}, JSON, 400, "InvalidRequest", "not both"),
        ({"body": {"txt": "a"}}, JSON, 400, "InvalidRequest", "unknown field(s) 'txt'"),
        ({"body": {}}, JSON, 400, "InvalidRequest", "empty"),
        ({"body": [1, 2]}, JSON, 400, "InvalidRequest", "got a JSON array"),
        ({"body": 7}, JSON, 400, "InvalidRequest", "got a JSON number"),
        ({"body": {"text": "\ud800"}}, JSON, 400, "InvalidEncoding", "surrogate"),
    ],
)
def test_client_mistakes(row, content_type, status, kind, words):
    result = parse_request(row, content_type, 4)
    assert isinstance(result, RequestError)
    assert (result.status, result.type) == (status, kind)
    assert words in result.message
    assert json.loads(json.dumps(result.body())) == {"code": status, "type": kind, "message": result.message}


def test_render_shapes_single_and_list():
    assert TextRequest(("a",), True).render([{"x": 1}]) == {"x": 1}
    assert TextRequest(("a", "b"), False).render([1, 2]) == [1, 2]
    with pytest.raises(ValueError):
        TextRequest(("a", "b"), False).render([1])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)


@given(st.binary(max_size=300), st.sampled_from([None, "text/plain", JSON, "application/octet-stream"]))
def test_arbitrary_bytes_never_raise(body, content_type):
    result = parse(body, content_type, max_texts=8)
    assert isinstance(result, (TextRequest, RequestError))
    if isinstance(result, RequestError):
        assert 400 <= result.status < 500


@given(json_values)
def test_arbitrary_json_never_raises(value):
    result = parse_value(value, JSON, 8)
    assert isinstance(result, (TextRequest, RequestError))
    if isinstance(result, TextRequest):
        assert all(isinstance(t, str) and t.strip() for t in result.texts)
        assert 1 <= len(result.texts) <= 8


def v2(data, shape=None, datatype="BYTES", **extra):
    tensor = {"name": "text", "datatype": datatype, "shape": shape if shape is not None else [len(data)], "data": data}
    return {"inputs": [tensor], **extra}


def test_kserve_v2_bytes_input_carries_several_texts():
    parsed = parse_value(v2(["a b", "c"], id="r1"), JSON, 8)
    assert isinstance(parsed, V2Request) and parsed.texts == ("a b", "c") and parsed.id == "r1"
    assert parse_value(v2([["a"], ["b"]], shape=[2, 1]), JSON, 8).texts == ("a", "b")


@pytest.mark.parametrize(
    "body, words",
    [
        (v2(["a"], datatype="FP32"), 'datatype must be "BYTES"'),
        (v2(["a", "b"], shape=[3]), "shape [3] holds 3 items but data has 2"),
        (v2(["a"], shape="1"), "shape must be a list of integers"),
        (v2(["a", 5]), "inputs[0].data[1] must be a string"),
        (v2([]), "empty list"),
        ({"inputs": []}, "exactly one tensor"),
        ({"inputs": [1]}, "exactly one tensor"),
        (v2(["a"], id=7), '"id" must be a string'),
        (v2(["a"], extra=1), "unknown field(s) 'extra'"),
    ],
)
def test_kserve_v2_mistakes(body, words):
    result = parse_value(body, JSON, 8)
    assert isinstance(result, RequestError) and result.status == 400 and words in result.message


def test_kserve_v2_response_has_one_tensor_per_field():
    request = V2Request(("a", "b"), "r1")
    answers = [
        {"embedding": [0.5, 0.25], "label": "x", "scores": {"x": 0.9, "y": 0.1}, "tokens": 3, "truncated": False},
        {"embedding": [1.0, 0.0], "label": "y", "scores": {"x": 0.2, "y": 0.8}, "tokens": 4, "truncated": True},
    ]
    body = request.render(answers, "minilm")
    assert body["id"] == "r1" and body["model_name"] == "minilm"
    out = {o["name"]: o for o in body["outputs"]}
    assert out["embedding"] == {"name": "embedding", "datatype": "FP32", "shape": [2, 2], "data": [0.5, 0.25, 1.0, 0.0]}
    assert out["label"]["datatype"] == "BYTES" and out["label"]["data"] == ["x", "y"]
    assert out["scores"]["shape"] == [2, 2] and out["scores"]["data"] == [0.9, 0.1, 0.2, 0.8]
    assert out["tokens"]["datatype"] == "INT64" and out["truncated"]["datatype"] == "BOOL"
    assert "id" not in V2Request(("a",)).render(answers[:1], "m")


def test_kserve_v1_instances():
    parsed = parse_value({"instances": ["a", {"text": "b"}]}, JSON, 8)
    assert isinstance(parsed, V1Request) and parsed.texts == ("a", "b")
    assert parsed.render([1, 2]) == {"predictions": [1, 2]}
    bad = parse_value({"instances": [{"txt": "b"}]}, JSON, 8)
    assert isinstance(bad, RequestError) and "instances[0] must be a string" in bad.message
