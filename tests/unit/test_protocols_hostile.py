"""Hostile and costly bodies: arbitrary bytes and JSON never raise (a 4xx at worst), and what would be slow to
parse or large to answer (huge shapes, ids, keys, element counts, token id lists) is refused or cut cheaply."""

from __future__ import annotations

import json
import struct
import time

from hypothesis import given
from hypothesis import strategies as st

from bucketing.protocols.base import RequestError, quote
from bucketing.protocols.openai import EmbeddingsRequest
from tests.unit.wire import JSON, incoming, parse, v2

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


def test_error_messages_quote_little_of_what_the_client_sent():
    huge = "\u00e9" * 1_100_000
    for body in ({huge: 1}, {"txt": huge, "tx": 1, "t": 2, "a": 3, "b": 4, "c": 5, "d": 6}, v2(["a"], datatype=huge)):
        result = incoming(body, JSON)
        assert isinstance(result.outcome, RequestError)
        assert len(result.reply([], "m", 10**6).body) < 1000  # ~100 characters quoted, JSON-escaped
    result = incoming({"input": "x", "encoding_format": huge}, JSON, "v1/embeddings")
    assert len(result.reply([], "m", 10**6).body) < 1000  # ~100 characters quoted, JSON-escaped
    assert quote("abc") == "'abc'" and quote("x" * 500).endswith("(502 characters)")


def test_kserve_v2_huge_shape_is_refused_before_any_arithmetic():
    result = parse(v2(["a"], shape=[2**62] * 40000), JSON)
    assert isinstance(result, RequestError) and result.status == 400 and "40000 dimensions" in result.message
    result = parse(v2(["a"], shape=[2**62]), JSON)
    assert isinstance(result, RequestError) and result.status == 413


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
    assert error.status == 413 and error.message == (
        '"inputs[0].data" has more than 4 items; at most 4 per request (handler.max_texts_per_request): send them '
        "in several requests"
    )


def test_openai_token_ids_past_max_length_are_not_all_validated():
    ids = [5] * 16 + [10**9] * 1_500_000  # out of vocabulary, but past max_length: cut away unread
    t = time.perf_counter()
    request = incoming({"input": ids}, JSON, url_path="v1/embeddings").outcome
    assert isinstance(request, EmbeddingsRequest) and request.inputs == ((5,) * 16 + (10**9,),)
    assert time.perf_counter() - t < 30  # generous: what matters is that it is not the 1.5 M-id loop of before
    error = incoming({"input": [5] * 15 + [10**9]}, JSON, url_path="v1/embeddings").outcome
    assert error.status == 400 and "input[15] = 1000000000 is not a token id" in error.message
