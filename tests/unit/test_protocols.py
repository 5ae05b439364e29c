"""Wire formats: every accepted shape, a clear 4xx naming the problem for each client mistake, hostile bodies."""

from __future__ import annotations

import base64
import json
import struct
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bucketing import protocols
from bucketing.answers import Answer, Options, activate
from bucketing.kinds import answer_fields
from bucketing.protocols import kserve_v1, kserve_v2, native, openai
from bucketing.protocols.base import Binary, Limits, Meta, Request, RequestError, quote, snake
from bucketing.protocols.kserve_v1 import V1Request
from bucketing.protocols.kserve_v2 import V2Request
from bucketing.protocols.native import TextRequest
from bucketing.protocols.openai import EmbeddingsRequest, ModelsRequest

JSON = "application/json"
LIMITS = Limits(max_texts=4, max_length=16, vocab_size=1000, task="embedding", dimensions=4)


def incoming(body, content_type=None, url_path=None, limits=LIMITS, row=None, headers=None):
    meta = Meta(content_type, url_path, headers or {})
    return protocols.parse(row if row is not None else {"body": body}, meta, limits)


def parse(body, content_type=None, max_texts=4):
    return incoming(body, content_type, limits=Limits(max_texts, 16, 1000, "embedding", 4)).outcome


def answer(values, tokens=3, truncated=False, labels=None, activation="identity", normalize=False):
    """An answer whose values are answered as given (identity activation, no normalisation, unless told)."""
    return Answer(np.asarray(values, dtype=np.float32), tokens, truncated, labels, activation, normalize)


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


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
PATHS = [None, "", "v1/embeddings", "v1/models", "v1/nope", "other"]


@given(
    st.binary(max_size=300),
    st.sampled_from([None, "text/plain", JSON, "application/octet-stream"]),
    st.sampled_from(PATHS),
)
def test_arbitrary_bytes_never_raise(body, content_type, url_path):
    result = incoming(body, content_type, url_path)
    if isinstance(result.outcome, RequestError):
        assert 400 <= result.outcome.status < 500
    json.loads(result.reply([], "m", 10**6).body) if isinstance(result.outcome, RequestError) else None


@given(json_values, st.sampled_from(PATHS))
def test_arbitrary_json_never_raises(value, url_path):
    result = incoming(value, JSON, url_path)
    outcome = result.outcome
    if isinstance(outcome, RequestError):
        assert 400 <= outcome.status < 500
    else:
        assert all(isinstance(t, (str, tuple)) for t in outcome.inputs)
        assert len(outcome.inputs) <= 4


def v2(data, shape=None, datatype="BYTES", **extra):
    tensor = {"name": "text", "datatype": datatype, "shape": shape if shape is not None else [len(data)], "data": data}
    return {"inputs": [tensor], **extra}


def test_kserve_v2_bytes_input_carries_several_texts():
    result = incoming(v2(["a b", "c"], id="r1"), JSON)
    assert result.wire is kserve_v2
    assert result.outcome == V2Request(("a b", "c"), "r1")
    assert parse(v2([["a"], ["b"]], shape=[2, 1]), JSON).inputs == ("a", "b")
    # fields the Open Inference Protocol's clients add are tolerated
    assert parse(v2(["a"], model_name="m", model_version="1", parameters={}), JSON).inputs == ("a",)


@pytest.mark.parametrize(
    "body, status, words",
    [
        (v2(["a"], datatype="FP32"), 400, 'datatype must be "BYTES"'),
        (v2(["a", "b"], shape=[3]), 400, "shape [3] holds 3 items but data has 2"),
        (v2(["a"], shape="1"), 400, "shape must be a list of 1 or 2 integers"),
        (v2(["a"], shape=[1, 1, 1]), 400, "3 dimensions"),
        (v2(["a"], shape=[1, 2]), 400, "one text per row"),
        (v2(["a"], shape=[-1]), 400, "non-negative integer"),
        (v2(["a"] * 5), 413, "at most 4"),
        (v2(["a", 5]), 400, "inputs[0].data[1] must be a string"),
        (v2([]), 400, "empty list"),
        ({"inputs": []}, 400, "exactly one tensor"),
        ({"inputs": [{}, {}, {}]}, 400, "exactly one tensor"),  # a list of non-objects is TEI's (by shape)
        (v2(["a"], id=7), 400, '"id" must be a string'),
    ],
)
def test_kserve_v2_mistakes(body, status, words):
    result = parse(body, JSON)
    assert isinstance(result, RequestError) and result.status == status and words in result.message


def test_kserve_v2_huge_shape_is_refused_before_any_arithmetic():
    result = parse(v2(["a"], shape=[2**62] * 40000), JSON)
    assert isinstance(result, RequestError) and result.status == 400 and "40000 dimensions" in result.message
    result = parse(v2(["a"], shape=[2**62]), JSON)
    assert isinstance(result, RequestError) and result.status == 413


def test_kserve_v2_response_has_one_tensor_per_field():
    request = V2Request(("a", "b"), "r1")
    labels = ("x", "y")
    body = request.render([answer([0.9, 0.1], 3, False, labels), answer([0.2, 0.8], 4, True, labels)], "minilm")
    assert body["id"] == "r1" and body["model_name"] == "minilm"
    out = {o["name"]: o for o in body["outputs"]}
    assert out["label"]["datatype"] == "BYTES" and out["label"]["data"] == ["x", "y"]
    assert out["scores"]["shape"] == [2, 2] and out["scores"]["parameters"] == {"labels": ["x", "y"]}
    assert np.allclose(out["scores"]["data"], [0.9, 0.1, 0.2, 0.8])
    assert out["tokens"] == {"name": "tokens", "datatype": "INT64", "shape": [2], "data": [3, 4]}
    assert out["truncated"]["datatype"] == "BOOL"
    emb = V2Request(("a",)).render([answer([0.5, 0.25])], "m")
    assert "id" not in emb and emb["outputs"][0] == {
        "name": "embedding",
        "datatype": "FP32",
        "shape": [1, 2],
        "data": [0.5, 0.25],
    }


def test_kserve_v2_outputs_refuse_a_field_they_cannot_type():
    with pytest.raises(TypeError, match="no v2 datatype"):
        kserve_v2.outputs([{"weird": None}])


def test_kserve_v1_instances():
    result = incoming({"instances": ["a", {"text": "b"}], "parameters": {}}, JSON)
    assert result.wire is kserve_v1 and result.outcome == V1Request(("a", "b"))
    assert result.outcome.render([answer([1.0]), answer([0.0])])["predictions"][1]["embedding"] == [0.0]
    bad = parse({"instances": [{"txt": "b"}]}, JSON)
    assert isinstance(bad, RequestError) and "instances[0] must be a string" in bad.message


def test_error_messages_quote_little_of_what_the_client_sent():
    huge = "\u00e9" * 1_100_000
    for body in ({huge: 1}, {"txt": huge, "tx": 1, "t": 2, "a": 3, "b": 4, "c": 5, "d": 6}, v2(["a"], datatype=huge)):
        result = incoming(body, JSON)
        assert isinstance(result.outcome, RequestError)
        assert len(result.reply([], "m", 10**6).body) < 1000  # ~100 characters quoted, JSON-escaped
    result = incoming({"input": "x", "encoding_format": huge}, JSON, "v1/embeddings")
    assert len(result.reply([], "m", 10**6).body) < 1000  # ~100 characters quoted, JSON-escaped
    assert quote("abc") == "'abc'" and quote("x" * 500).endswith("(502 characters)")


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
    assert result.wire is openai and result.outcome.inputs == inputs


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
    assert other.wire is native and json.loads(other.reply([], "m", 10**6).body)["code"] == 404


def test_openai_embeddings_on_a_classifier_is_a_404_saying_what_is_served():
    classifier = Limits(4, 16, 1000, "classification", 3)
    result = incoming({"input": "x"}, JSON, "v1/embeddings", limits=classifier)
    assert result.outcome.status == 404 and "classification model" in result.outcome.message


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


def v2_binary(texts, extra=None, header=None):
    """A body as KServe's and Triton's clients send it with binary_data=True."""
    raw = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    tensor = {"name": "text", "datatype": "BYTES", "shape": [len(texts)], "parameters": {"binary_data_size": len(raw)}}
    head = json.dumps(header or {"id": "b1", "model_name": "m", "inputs": [tensor], **(extra or {})}).encode()
    return head + raw, {"inference-header-content-length": str(len(head))}


def test_kserve_v2_binary_inputs():
    body, headers = v2_binary(["caf\u00e9", "a b", "c"])
    result = incoming(body, "application/octet-stream", headers=headers)
    assert result.wire is kserve_v2 and result.outcome == V2Request(("caf\u00e9", "a b", "c"), "b1")


@pytest.mark.parametrize(
    "mutate, status, words",
    [
        (lambda b, h: (b, {"inference-header-content-length": "x"}), 400, "must be a length"),
        (lambda b, h: (b, {"inference-header-content-length": str(len(b) + 1)}), 400, "must be a length"),
        (lambda b, h: (b[:-1], h), 400, "5 bytes follow"),
        (lambda b, h: (b[: int(h["inference-header-content-length"])], h), 400, "0 bytes follow"),
        (lambda b, h: (b"{" + b[1:], {"inference-header-content-length": "3"}), 400, "not a JSON object"),
    ],
)
def test_kserve_v2_binary_mistakes(mutate, status, words):
    body, headers = mutate(*v2_binary(["ab"]))
    result = incoming(body, "application/octet-stream", headers=headers)
    assert isinstance(result.outcome, RequestError) and result.outcome.status == status, result.outcome
    assert words in result.outcome.message


def test_kserve_v2_binary_elements_are_checked():
    raw = struct.pack("<I", 10) + b"short"
    head = json.dumps(
        {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(raw)}}]}
    ).encode()
    result = incoming(head + raw, None, headers={"inference-header-content-length": str(len(head))})
    assert result.outcome.status == 400 and "claims 10 bytes" in result.outcome.message
    too_many = kserve_v2.decode_bytes(b"".join(struct.pack("<I", 1) + b"x" for _ in range(5)), 4)
    assert isinstance(too_many, RequestError) and too_many.status == 413
    not_utf8 = kserve_v2.decode_bytes(struct.pack("<I", 2) + b"\xff\xfe", 4)
    assert isinstance(not_utf8, RequestError) and not_utf8.type == "InvalidEncoding"


def test_kserve_v2_outputs_selected_and_binary():
    answers = [answer([0.5, 0.25], 3), answer([1.0, 0.0], 4, True)]
    request = parse(
        v2(["a", "b"], outputs=[{"name": "tokens"}, {"name": "embedding", "parameters": {"binary_data": True}}]), JSON
    )
    assert request.outputs == ("tokens", "embedding") and request.binary == frozenset({"embedding"})
    rendered = request.render(answers, "m")
    assert isinstance(rendered, Binary) and [t["name"] for t in rendered.header["outputs"]] == ["tokens", "embedding"]
    tokens, embedding = rendered.header["outputs"]
    assert tokens["data"] == [3, 4] and "data" not in embedding and embedding["parameters"]["binary_data_size"] == 16
    assert np.array_equal(np.frombuffer(rendered.chunks[0], "<f4"), np.array([0.5, 0.25, 1.0, 0.0], "<f4"))
    everything = parse(v2(["a", "b"], parameters={"binary_data_output": True}), JSON).render(answers, "m")
    assert [t["parameters"]["binary_data_size"] for t in everything.header["outputs"]] == [16, 16, 2]
    assert everything.chunks[2] == b"\x00\x01"
    reply = protocols.Incoming(kserve_v2, parse(v2(["a", "b"], parameters={"binary_data_output": True}), JSON))
    sent = reply.reply(answers, "m", 10**6)
    length = int(dict(sent.headers)["Inference-Header-Content-Length"])
    assert sent.content_type == "application/octet-stream" and json.loads(sent.body[:length])["model_name"] == "m"
    unknown = parse(v2(["a"], outputs=[{"name": "logits"}]), JSON)
    assert unknown.status == 400 and "unknown output(s) 'logits'" in unknown.message


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


def test_duplicate_v2_output_names_are_the_clients_400_even_as_binary():
    body = v2(["a"], outputs=[{"name": "embedding", "parameters": {"binary_data": True}}, {"name": "embedding"}])
    error = incoming(body, JSON).outcome
    assert error == RequestError(400, "InvalidRequest", "output(s) 'embedding' asked for more than once", "outputs")


def test_a_huge_v2_id_is_refused_with_what_is_wrong():
    error = incoming(v2(["a"], id="x" * 7_000_000), JSON).outcome
    assert (
        error.status == 400
        and error.message == '"id" has 7000000 characters; at most 1024 (it is echoed in the answer)'
    )


def test_binary_elements_past_the_limit_are_not_miscounted():
    raw = b"".join(struct.pack("<I", 1) + b"t" for _ in range(100_000))  # the shape says 4; 100,000 elements follow
    tensor = {"name": "text", "datatype": "BYTES", "shape": [4], "parameters": {"binary_data_size": len(raw)}}
    head = json.dumps({"inputs": [tensor]}).encode()
    body, headers = head + raw, {"inference-header-content-length": str(len(head))}
    error = incoming(body, "application/octet-stream", headers=headers).outcome
    assert error.status == 413 and error.message == '"inputs[0].data" has more than 4 items; at most 4 per request'


def test_openai_token_ids_past_max_length_are_not_all_validated():
    ids = [5] * 16 + [10**9] * 1_500_000  # out of vocabulary, but past max_length: cut away unread
    t = time.perf_counter()
    request = incoming({"input": ids}, JSON, url_path="v1/embeddings").outcome
    assert isinstance(request, EmbeddingsRequest) and request.inputs == ((5,) * 16 + (10**9,),)
    assert time.perf_counter() - t < 30  # generous: what matters is that it is not the 1.5 M-id loop of before
    error = incoming({"input": [5] * 15 + [10**9]}, JSON, url_path="v1/embeddings").outcome
    assert error.status == 400 and "input[15] = 1000000000 is not a token id" in error.message


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


def test_an_integer_too_long_for_python_is_invalid_json_without_a_python_hint():
    error = parse(b'{"text": ' + b"9" * 5000 + b"}", JSON)
    assert error.type == "InvalidJSON" and "sys." not in error.message and "integer of more than" in error.message


PROMPTED = Limits(4, 16, 1000, "embedding", 4, prompts=(("query", "query: "), ("doc", "")), default_prompt="query")


@pytest.mark.parametrize(
    ("body", "url_path", "prompt"),
    [
        ({"text": "a"}, None, "query: "),  # the model's default prompt
        ({"text": "a", "prompt_name": "doc"}, None, ""),
        ({"text": "a", "prompt": "custom: "}, None, "custom: "),
        ({"input": "a", "prompt_name": "doc"}, "v1/embeddings", ""),  # OpenAI: an extra field
        ({"input": ["a"]}, "v1/embeddings", "query: "),
        (
            {
                "inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
                "parameters": {"prompt": "p: "},
            },
            None,
            "p: ",
        ),  # KServe v2: in parameters
        ({"instances": ["a"]}, None, "query: "),  # KServe v1: no parameters, the default
    ],
)
def test_every_wire_format_picks_a_prompt(body, url_path, prompt):
    request = incoming(body, JSON, url_path=url_path, limits=PROMPTED).outcome
    assert not isinstance(request, RequestError), request
    assert request.options.prompt == prompt


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            {"text": "a", "prompt_name": "nope"},
            "\"prompt_name\" 'nope' is not a prompt of this model; its prompts: 'query', 'doc'",
        ),
        ({"text": "a", "prompt_name": "doc", "prompt": "x"}, 'send "prompt_name" or "prompt", not both'),
        ({"text": "a", "normalize": "yes"}, '"normalize" must be true or false, got string'),
        ({"text": "a", "dimensions": 5}, '"dimensions" must be an integer from 1 to 4'),
        ({"text": "a", "prompt": 3}, '"prompt" must be a string of at most 4096 characters'),
    ],
)
def test_option_mistakes_are_400s_saying_what_is_wrong(body, words):
    error = incoming(body, JSON, limits=PROMPTED).outcome
    assert isinstance(error, RequestError) and error.status == 400 and words in error.message


def test_a_model_without_prompts_says_so():
    error = incoming({"text": "a", "prompt_name": "query"}, JSON).outcome
    assert error.message.endswith("its prompts: none (this model has no prompts)")


CLASSIFIER = Limits(4, 16, 1000, "classification", 1)


def test_kserve_v2_two_inputs_are_text_pairs_for_a_classifier():
    from bucketing.protocols.base import Pair

    body = {
        "inputs": [
            {"name": "text_pair", "datatype": "BYTES", "shape": [2], "data": ["d1", "d2"]},
            {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["q", "q"]},
        ]
    }
    request = incoming(body, JSON, limits=CLASSIFIER).outcome
    assert request.inputs == (Pair("q", "d1"), Pair("q", "d2"))
    rendered = request.render([answer([0.5], labels=("s",)), answer([0.25], labels=("s",))], "m")
    score = next(o for o in rendered["outputs"] if o["name"] == "score")
    assert score == {"name": "score", "datatype": "FP32", "shape": [2], "data": [0.5, 0.25]}
    uneven = {"inputs": [{**body["inputs"][0], "shape": [1], "data": ["d1"]}, body["inputs"][1]]}
    assert "one pair per row" in incoming(uneven, JSON, limits=CLASSIFIER).outcome.message
    misnamed = {"inputs": [{**body["inputs"][0], "name": "other"}, body["inputs"][1]]}
    assert 'named "text" and "text_pair"' in incoming(misnamed, JSON, limits=CLASSIFIER).outcome.message
    assert "text pairs need a classification model" in incoming(body, JSON).outcome.message


def test_cohere_documents_may_be_objects_and_top_n_is_checked():
    from bucketing.protocols import cohere_rerank
    from bucketing.protocols.base import Pair

    ok = incoming({"query": "q", "documents": [{"text": "a"}, "b"]}, JSON, url_path="v1/rerank", limits=CLASSIFIER)
    assert ok.wire is cohere_rerank and ok.outcome.inputs == (Pair("q", "a"), Pair("q", "b"))
    bad = incoming({"query": "q", "documents": ["a"], "top_n": 0}, JSON, url_path="v1/rerank", limits=CLASSIFIER)
    assert bad.outcome.param == "top_n" and json.loads(bad.reply([], "m", 10**6).body)["error"]["param"] == "top_n"


def test_every_wire_format_is_registered_once_with_its_routes():
    tei = {"embed", "predict", "similarity", "tokenize", "decode", "info", "embed_sparse", "embed_all"}
    assert set(protocols.ROUTES) == {"", "v1/embeddings", "v1/models", "rerank", "v1/rerank", *tei}
    for wire in protocols.WIRES:
        assert wire.SERVED in protocols.SERVED and callable(wire.error_body)
    assert incoming({}, JSON, url_path="v1/nope").wire is openai  # a 404 in the shape of its neighbours


def v2_pair_body(binary_names, queries=("q", "q"), documents=("d1", "d2"), order=("text", "text_pair")):
    """A v2 pair request whose inputs named in `binary_names` carry their data as binary (in the order sent)."""
    columns = {"text": list(queries), "text_pair": list(documents)}
    tensors, raw = [], b""
    for name in order:
        data = columns[name]
        tensor = {"name": name, "datatype": "BYTES", "shape": [len(data)]}
        if name in binary_names:
            chunk = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in data)
            tensor["parameters"] = {"binary_data_size": len(chunk)}
            raw += chunk
        else:
            tensor["data"] = data
        tensors.append(tensor)
    head = json.dumps({"inputs": tensors}).encode()
    return head + raw, {"inference-header-content-length": str(len(head))}


@pytest.mark.parametrize("order", [("text", "text_pair"), ("text_pair", "text")])
@pytest.mark.parametrize("binary_names", [{"text"}, {"text_pair"}, {"text", "text_pair"}])
def test_kserve_v2_pairs_with_either_input_binary_are_served(binary_names, order):
    from bucketing.protocols.base import Pair

    body, headers = v2_pair_body(binary_names, ("q1", "q2"), ("d1", "d2"), order)
    request = incoming(body, "application/octet-stream", headers=headers, limits=CLASSIFIER).outcome
    assert isinstance(request, V2Request), request
    assert request.inputs == (Pair("q1", "d1"), Pair("q2", "d2"))


def test_kserve_v2_pair_binary_sizes_must_add_up():
    body, headers = v2_pair_body({"text_pair"})
    error = incoming(body + b"x", "application/octet-stream", headers=headers, limits=CLASSIFIER).outcome
    assert error.status == 400 and "binary_data_size add up to 12 but 13 bytes follow" in error.message
    head = json.loads(body[: int(headers["inference-header-content-length"])])
    head["inputs"][0]["parameters"] = {"binary_data_size": "4"}
    head = json.dumps(head).encode()
    rebuilt = head + body[int(headers["inference-header-content-length"]) :]
    headers = {"inference-header-content-length": str(len(head))}
    error = incoming(rebuilt, "application/octet-stream", headers=headers, limits=CLASSIFIER).outcome
    assert error.status == 400 and "inputs[0].parameters.binary_data_size must be a byte count" in error.message


@pytest.mark.parametrize(
    ("body", "url_path", "limits", "param"),
    [
        ({"query": "q\ud800", "texts": ["a"]}, "rerank", CLASSIFIER, "query"),
        ({"query": "\ud800", "documents": ["a"]}, "v1/rerank", CLASSIFIER, "query"),
        ({"text": "a", "prompt": "p\ud800: "}, None, PROMPTED, "prompt"),
        ({"input": ["a"], "prompt": "\udfff"}, "v1/embeddings", PROMPTED, "prompt"),
        (
            {
                "inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
                "parameters": {"prompt": "\ud800"},
            },
            None,
            PROMPTED,
            "prompt",
        ),
    ],
)
def test_a_lone_surrogate_in_a_query_or_prompt_is_the_clients_400(body, url_path, limits, param):
    """Valid JSON ("\\ud800") that no tokenizer can read: InvalidEncoding, as in a text, never a 500."""
    error = incoming(body, JSON, url_path=url_path, limits=limits).outcome
    assert isinstance(error, RequestError), error
    assert (error.status, error.type, error.param) == (400, "InvalidEncoding", param) and "surrogate" in error.message
