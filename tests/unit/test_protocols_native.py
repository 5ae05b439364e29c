"""Our own wire format: every accepted shape (JSON or plain text, by Content-Type and by the body), a clear 4xx
naming the problem for each client mistake, its answers' shapes."""

from __future__ import annotations

import json

import pytest

from bucketing.protocols.base import RequestError
from bucketing.protocols.native import TextRequest
from tests.unit.wire import JSON, answer, incoming, parse
from tsctl.inprocess import torchserve_body


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
        # The JSON rule: no Content-Type and a body starting with "{" is JSON; text/plain is always one text.
        (b'{"text": "x"}', None, ("x",), True),
        (b'  {"texts": ["x", "y"]}', "", ("x", "y"), False),
        (b'{"text": "x"}', "text/plain", ('{"text": "x"}',), True),
        (b"[1] a numbered line", None, ("[1] a numbered line",), True),
    ],
)
def test_accepted_shapes(body, content_type, texts, single):
    assert parse(body, content_type) == TextRequest(texts, single)


def test_data_key_is_accepted_like_body():
    assert incoming(None, row={"data": b"hi"}).outcome == TextRequest(("hi",), True)


@pytest.mark.parametrize(
    "row, content_type, status, kind, words",
    [
        ({"body": b""}, None, 400, "EmptyBody", "no body"),
        ({}, None, 400, "EmptyBody", "no body"),
        ({"hello world": b""}, "application/x-www-form-urlencoded", 415, "UnsupportedMediaType", "form"),
        ({}, "application/x-www-form-urlencoded", 415, "UnsupportedMediaType", "Content-Type"),
        ({"body": b"   \n"}, "text/plain", 400, "EmptyText", "the body is empty"),
        ({"body": {"text": ""}}, JSON, 400, "EmptyText", '"text" is empty'),
        ({"body": b'{"text": '}, JSON, 400, "InvalidJSON", "line 1 column 10"),
        ({"body": b'{"text": '}, None, 400, "InvalidJSON", "Content-Type: text/plain"),
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
        ({"body": b'{"text": ' + b"1" * 5000 + b"}"}, JSON, 400, "InvalidJSON", "not valid JSON"),
    ],
)
def test_client_mistakes(row, content_type, status, kind, words):
    result = incoming(None, content_type, row=row)
    assert isinstance(result.outcome, RequestError)
    assert (result.outcome.status, result.outcome.type) == (status, kind)
    assert words in result.outcome.message
    reply = result.reply([], "m", 10**6)
    assert reply.status == status
    assert json.loads(reply.body) == {"code": status, "type": kind, "message": result.outcome.message}


def test_render_shapes_single_and_list():
    one, two = answer([1.0, 0.0]), answer([0.0, 1.0])
    assert TextRequest(("a",), True).render([one]) == {"embedding": [1.0, 0.0], "tokens": 3, "truncated": False}
    assert [a["embedding"] for a in TextRequest(("a", "b"), False).render([one, two])] == [[1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(ValueError):
        TextRequest(("a", "b"), False).render([one])


@pytest.mark.parametrize(
    ("row", "content_type"),
    [
        ({"body": b'\xef\xbb\xbf{"text": "hello"}'}, None),  # a BOM, then JSON, no Content-Type
        ({"body": b'\xef\xbb\xbf{"text": "hello"}'}, "application/json; charset=utf-8"),
        ({"body": '{"text": "hello"}'}, "text/json"),  # TorchServe hands a text/* body over as a string
        ({"body": '\ufeff{"text": "hello"}'}, "text/json"),
        ({"body": b'{"text": "hello"}'}, "application/vnd.api+json"),
    ],
)
def test_a_json_envelope_is_never_embedded_as_text(row, content_type):
    assert incoming(None, content_type, row=row).outcome == TextRequest(("hello",), single=True)


def test_a_bom_before_a_text_body_is_not_part_of_the_text():
    assert parse(b"\xef\xbb\xbfhello", "text/plain") == TextRequest(("hello",), single=True)
    assert parse("\ufeffhello", "text/plain") == TextRequest(("hello",), single=True)


def test_an_integer_too_long_for_python_is_invalid_json_without_a_python_hint():
    error = parse(b'{"text": ' + b"9" * 5000 + b"}", JSON)
    assert error.type == "InvalidJSON" and "sys." not in error.message and "integer of more than" in error.message


def as_torchserve(raw, content_type, url_path=None):
    """What the handler makes of an HTTP body with this Content-Type, as TorchServe's worker hands it over."""
    body, media = torchserve_body(raw, content_type)
    return incoming(None, media, url_path=url_path, row={"body": body}).outcome


JSON_TYPES = ["application/json", "application/json; charset=utf-8", "text/json", "application/vnd.api+json"]


@pytest.mark.parametrize("content_type", JSON_TYPES)
@pytest.mark.parametrize("raw", [b'"{\\"text\\": \\"hello\\"}"', b'"hello"'])
def test_a_json_string_body_is_decoded_once_and_refused_naming_the_shapes(raw, content_type):
    error = as_torchserve(raw, content_type)
    assert isinstance(error, RequestError), error
    assert (error.status, error.type) == (400, "InvalidRequest")
    assert 'expected a JSON object {"text": ...} or {"texts": [...]}, got a JSON string' in error.message
    assert "text/plain" in error.message


@pytest.mark.parametrize("content_type", JSON_TYPES)
def test_a_json_envelope_is_decoded_once_however_torchserve_hands_it_over(content_type):
    assert as_torchserve(b'{"text": "hello"}', content_type) == TextRequest(("hello",), single=True)


@pytest.mark.parametrize(
    ("url_path", "status", "words"),
    [("v1/embeddings", 400, "got a JSON string"), ("embed", 422, "got a JSON string")],
)
def test_a_json_string_is_refused_by_every_wire_format(url_path, status, words):
    error = as_torchserve(b'"hello"', "application/json", url_path)
    assert isinstance(error, RequestError) and error.status == status and words in error.message


@pytest.mark.parametrize("content_type", ["application/octet-stream", "application/octet-stream; x=1"])
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"text": "hello"}', TextRequest(("hello",), single=True)),
        (b'\xef\xbb\xbf  {"texts": ["a", "b"]}', TextRequest(("a", "b"), single=False)),
        (b"plain words", TextRequest(("plain words",), single=True)),
        (b"[1] a numbered line", TextRequest(("[1] a numbered line",), single=True)),
    ],
)
def test_octet_stream_is_read_as_a_body_without_a_content_type(raw, expected, content_type):
    assert as_torchserve(raw, content_type) == as_torchserve(raw, None) == expected


def test_invalid_json_under_octet_stream_says_how_it_was_read():
    error = as_torchserve(b'{"text": ', "application/octet-stream")
    assert isinstance(error, RequestError) and error.type == "InvalidJSON"
    assert "application/octet-stream" in error.message and "Content-Type: text/plain" in error.message
