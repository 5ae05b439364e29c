"""KServe's JSON wire formats: v2 (Open Inference Protocol) tensors in and out, its mistakes, text pairs for a
classifier; v1 instances."""

from __future__ import annotations

import numpy as np
import pytest

from bucketing.protocols import kserve_v1, kserve_v2
from bucketing.protocols.base import BadRequest, RequestError
from bucketing.protocols.kserve_v1 import V1Request
from bucketing.protocols.kserve_v2 import V2Request
from tests.unit.wire import CLASSIFIER, JSON, answer, incoming, parse, v2


def test_kserve_v2_bytes_input_carries_several_texts():
    result = incoming(v2(["a b", "c"], id="r1"), JSON)
    assert result.wire is kserve_v2.WIRE
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


def test_duplicate_v2_output_names_are_the_clients_400_even_as_binary():
    body = v2(["a"], outputs=[{"name": "embedding", "parameters": {"binary_data": True}}, {"name": "embedding"}])
    error = incoming(body, JSON).outcome
    assert error == BadRequest("InvalidRequest", "output(s) 'embedding' asked for more than once", "outputs")
    assert error.status == 400


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


def test_kserve_v1_instances():
    result = incoming({"instances": ["a", {"text": "b"}], "parameters": {}}, JSON)
    assert result.wire is kserve_v1.WIRE and result.outcome == V1Request(("a", "b"))
    assert result.outcome.render([answer([1.0]), answer([0.0])])["predictions"][1]["embedding"] == [0.0]
    bad = parse({"instances": [{"txt": "b"}]}, JSON)
    assert isinstance(bad, RequestError) and "instances[0] must be a string" in bad.message


def test_kserve_v1_parameters_carry_our_options():
    packed = incoming({"instances": ["a"], "parameters": {"precision": "ubinary", "dimensions": 2}}, JSON)
    assert (packed.outcome.options.precision, packed.outcome.options.dimensions) == ("ubinary", 2)
    assert packed.outcome.render([answer([1.0, -1.0, 3.0, 4.0])])["predictions"][0]["embedding"] == [128]
    bad = parse({"instances": ["a"], "parameters": ["binary"]}, JSON)
    assert isinstance(bad, RequestError) and '"parameters" must be an object' in bad.message
    unknown = parse({"instances": ["a"], "parameters": {"precision": "int4"}}, JSON)
    assert isinstance(unknown, RequestError) and "precision" in unknown.message


@pytest.mark.parametrize("asked", [{"parameters": {"on_overflow": "chunk"}}, {}])
def test_kserve_v2_outputs_may_select_the_chunks_tensor_it_answers_under_chunk(asked):
    """Under `on_overflow: chunk` (the request's, or the handler's) each answer counts its windows, and `outputs` may
    select that `chunks` tensor; elsewhere it is unknown, as the answer has none."""
    from dataclasses import replace

    from tests.unit.wire import LIMITS

    limits = replace(LIMITS, on_overflow="truncate" if asked else "chunk")
    body = v2(["a", "b"], outputs=[{"name": "chunks"}, {"name": "embedding"}], **asked)
    request = incoming(body, JSON, limits=limits).outcome
    assert isinstance(request, V2Request) and request.outputs == ("chunks", "embedding")
    answers = [replace(answer([0.5, 0.5]), chunks=2), replace(answer([1.0, 0.0]), chunks=1)]
    out = request.render(answers, "m")["outputs"]
    assert [o["name"] for o in out] == ["chunks", "embedding"] and out[0]["data"] == [2, 1]
    plain = incoming(v2(["a"], outputs=[{"name": "chunks"}]), JSON, limits=replace(limits, on_overflow="truncate"))
    assert isinstance(plain.outcome, RequestError) and "unknown output(s) 'chunks'" in plain.outcome.message
