"""Cohere's embed v2 (`v2/embed`): its fields read as our options, its embedding types packed as
sentence-transformers packs them, its refusals in one line of Cohere's error shape."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bucketing.protocols import cohere_embed
from bucketing.protocols.base import Limits
from bucketing.quantize import Ranges
from tests.unit.wire import JSON, answer, incoming, raised

quantization = pytest.importorskip("sentence_transformers.util.quantization")

PROMPTED = Limits(4, 16, 1000, "embedding", 8, prompts=(("query", "q: "), ("document", ""), ("clustering", "c: ")))


def request(body, limits=PROMPTED):
    return cohere_embed.parse(body, limits)


def test_the_route_is_cohere_embed_and_its_errors_are_cohere_shaped():
    got = incoming({"texts": ["a", "b"]}, JSON, url_path="v2/embed", limits=PROMPTED)
    assert got.wire is cohere_embed.WIRE and got.outcome.inputs == ("a", "b")
    bad = incoming({"texts": []}, JSON, url_path="v2/embed", limits=PROMPTED)
    reply = bad.wire.error_reply(bad.outcome)
    assert reply.status == 400 and set(json.loads(reply.body)) == {"message"}


@pytest.mark.parametrize(
    ("input_type", "prompt"),
    [("search_query", "q: "), ("search_document", ""), ("clustering", "c: "), ("classification", ""), (None, "")],
)
def test_input_type_is_the_prompt_sentence_transformers_would_use(input_type, prompt):
    body = {"texts": ["a"]} | ({"input_type": input_type} if input_type else {})
    assert request(body).options.prompt == prompt


@pytest.mark.parametrize(
    ("truncate", "expected"), [("NONE", (False, "right")), ("START", (True, "left")), ("END", (True, "right"))]
)
def test_truncate_names_the_end_that_is_cut(truncate, expected):
    options = request({"texts": ["a"], "truncate": truncate}).options
    assert (options.truncate, options.truncation_direction) == expected
    assert request({"texts": ["a"]}).options.truncate is None  # absent: the server's on_overflow


def test_each_embedding_type_is_quantize_embeddings_of_the_served_vector():
    rng = np.random.default_rng(3)
    vectors = [rng.standard_normal(8).astype(np.float32) for _ in range(2)]
    parsed = request({"texts": ["a", "b"], "embedding_types": ["ubinary", "float", "binary", "float"]})
    assert parsed.types == ("ubinary", "float", "binary")
    body = parsed.render([answer(v) for v in vectors], "m")
    assert body["response_type"] == "embeddings_by_type" and body["texts"] == ["a", "b"]
    assert np.allclose(body["embeddings"]["float"], vectors)
    for packing in ("binary", "ubinary"):
        expected = quantization.quantize_embeddings(np.stack(vectors), packing).tolist()
        assert body["embeddings"][packing] == expected
    cut = request({"texts": ["a"], "output_dimension": 4}).render([answer(vectors[0])], "m")
    assert np.allclose(cut["embeddings"]["float"], [vectors[0][:4]])


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"texts": ["a"], "embedding_types": ["int8"]}, "needs per-dimension ranges"),
        ({"texts": ["a"], "embedding_types": ["base64"]}, "is not served"),
        ({"texts": ["a"], "embedding_types": ["fp16"]}, "is not one of"),
        ({"texts": ["a"], "embedding_types": []}, "non-empty array"),
        ({"texts": ["a"], "input_type": "image"}, "'input_type' must be one of"),
        ({"texts": ["a"], "truncate": "MIDDLE"}, "'truncate' must be NONE, START or END"),
        ({"texts": ["a"], "output_dimension": 9}, "from 1 to 8"),
        ({"texts": ["a"], "max_tokens": 8}, "'max_tokens' below max_length is not served"),
        ({"images": ["x"], "texts": ["a"]}, "'images' is not served"),
        ({"input_type": "search_query"}, "'texts' is required"),
        (["a"], "expected a JSON object"),
    ],
)
def test_a_field_it_cannot_serve_exactly_is_refused_in_one_line(body, says):
    error = raised(request, body)
    assert error.status == 400 and says in error.message and "\n" not in error.message


def test_a_model_without_dense_embeddings_is_refused():
    error = raised(request, {"texts": ["a"]}, Limits(4, 16, 1000, "classification", 2))
    assert "dense embeddings" in error.message and "a classification model" in error.message


def test_int8_and_uint8_are_answered_where_the_model_stores_ranges():
    ranges = np.stack([np.full(8, -1.0, np.float32), np.full(8, 1.0, np.float32)])
    limits = Limits(4, 16, 1000, "embedding", 8, ranges=Ranges(ranges))
    vector = np.linspace(-1, 1, 8, dtype=np.float32)
    body = request({"texts": ["a"], "embedding_types": ["int8", "uint8"]}, limits).render([answer(vector)], "m")
    for name in ("int8", "uint8"):
        expected = quantization.quantize_embeddings(vector[None, :], name, ranges=ranges).tolist()
        assert body["embeddings"][name] == expected
