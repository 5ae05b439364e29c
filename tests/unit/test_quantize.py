"""A dense embedding's precision: each packing equals sentence-transformers' `quantize_embeddings` of the same
vector (any size, signs, zeros), and every wire format reads, answers or refuses `precision` as it says."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from bucketing.protocols.base import Limits, RequestError
from bucketing.quantize import PRECISIONS, Ranges
from tests.unit.wire import CLASSIFIER, JSON, LIMITS, answer, incoming

quantization = pytest.importorskip("sentence_transformers.util.quantization")

FLOATS = st.floats(-2, 2, width=32).map(lambda x: 0.0 if abs(x) < 1e-3 else x)  # zeros: no bit, as `> 0` says


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, st.integers(1, 40), elements=FLOATS), st.sampled_from(["binary", "ubinary"]))
def test_a_packing_equals_quantize_embeddings(vector, name):
    got = PRECISIONS[name].apply(vector)
    expected = quantization.quantize_embeddings(vector[None, :], name)[0]
    assert got.dtype == expected.dtype and got.tolist() == expected.tolist()
    assert len(got) == PRECISIONS[name].size(len(vector))


def test_float_is_the_vector_as_served():
    vector = np.asarray([0.5, -0.25, 0.0], dtype=np.float32)
    assert PRECISIONS["float"].apply(vector).tolist() == [0.5, -0.25, 0.0]


@pytest.mark.parametrize(
    ("name", "values"), [("float", [0.6, -0.8, 0.0]), ("binary", [-128 + 0b10000000]), ("ubinary", [0b10000000])]
)
def test_our_json_answers_the_precision_asked_after_normalize(name, values):
    request = incoming({"texts": ["a"], "precision": name}, JSON).outcome
    assert not isinstance(request, RequestError), request
    got = request.render([answer([3, -4, 0], normalize=True)])[0]["embedding"]
    assert got == pytest.approx(values)


def test_kserve_v2_answers_binary_as_int8_and_ubinary_as_uint8():
    body = {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]}
    for name, datatype in (("binary", "INT8"), ("ubinary", "UINT8"), ("float", "FP32")):
        request = incoming({**body, "parameters": {"precision": name}}, JSON).outcome
        assert not isinstance(request, RequestError), request
        rendered = request.render([answer([1, -1, 1, 1, 0, 0, 0, 0, 1]), answer([-1] * 9)])
        tensor = next(t for t in rendered["outputs"] if t["name"] == "embedding")
        assert tensor["datatype"] == datatype
        if name != "float":
            expected = quantization.quantize_embeddings(np.asarray([[1, -1, 1, 1, 0, 0, 0, 0, 1], [-1] * 9]), name)
            assert tensor["shape"] == [2, 2] and tensor["data"] == expected.reshape(-1).tolist()


@pytest.mark.parametrize(
    ("body", "url_path", "limits", "words"),
    [
        ({"texts": ["a"], "precision": "fp8"}, None, LIMITS, "\"precision\" must be one of 'float', 'binary'"),
        ({"texts": ["a"], "precision": "int8"}, None, LIMITS, "needs per-dimension ranges fixed for the model"),
        ({"texts": ["a"], "precision": "binary"}, None, CLASSIFIER, '"precision" is for dense embeddings'),
        (
            {"texts": ["a"], "precision": "binary"},
            None,
            Limits(4, 16, 1000, "sparse", 1000),
            "this is a sparse model",
        ),
        ({"input": ["a"], "precision": "binary"}, "v1/embeddings", LIMITS, "'precision' is not an OpenAI field"),
        ({"inputs": ["a"], "precision": "binary"}, "embed", LIMITS, "`precision` is not a TEI field"),
    ],
)
def test_a_precision_not_served_exactly_is_refused_in_one_line(body, url_path, limits, words):
    error = incoming(body, JSON, url_path=url_path, limits=limits).outcome
    assert isinstance(error, RequestError) and error.status in (400, 422), error
    assert words in error.message and "\n" not in error.message and error.param == "precision"


@settings(max_examples=200, deadline=None)
@given(
    arrays(np.float32, st.integers(1, 24), elements=st.floats(-2, 2, width=32)),
    st.sampled_from(["int8", "uint8"]),
    st.integers(0, 2**16),
)
def test_a_ranged_precision_equals_quantize_embeddings_with_those_ranges(vector, name, seed):
    rng = np.random.default_rng(seed)
    low = rng.uniform(-2, 0, len(vector)).astype(np.float32)
    ranges = np.stack([low, low + rng.uniform(0, 2, len(vector)).astype(np.float32)])
    ranges[:, 0] = 0.5  # a zero range: sentence-transformers' step of 1
    got = PRECISIONS[name].apply(vector, ranges)
    expected = quantization.quantize_embeddings(vector[None, :], name, ranges=ranges)[0]
    assert got.dtype == expected.dtype and got.tolist() == expected.tolist()
    cut = PRECISIONS[name].apply(vector[:1], ranges)  # a cut vector takes its ranges' first components
    assert cut.tolist() == quantization.quantize_embeddings(vector[None, :1], name, ranges=ranges[:, :1])[0].tolist()


def test_stored_ranges_are_checked_in_one_line():
    from bucketing.quantize import parse_ranges

    good = parse_ranges({"minimums": [0, -1], "maximums": [1, 1], "texts": 9}, 2)
    assert good.bounds.dtype == np.float32 and good.bounds.shape == (2, 2) and good.calibration is None
    for data, says in [
        ([0, 1], "must be an object"),
        ({"minimums": [0], "maximums": [1]}, "holds 1 dimensions per list; this model's embeddings have 2"),
        ({"minimums": ["a", 0], "maximums": [1, 1]}, "lists of numbers"),
        ({"minimums": [2, 0], "maximums": [1, 1]}, "at most its maximum"),
        ({"minimums": [float("nan"), 0], "maximums": [1, 1]}, "finite"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse_ranges(data, 2)


def test_int8_is_answered_with_the_models_ranges_and_refused_without():
    ranges = np.array([[-1.0] * 4, [1.0] * 4], dtype=np.float32)
    ranged = Limits(4, 16, 1000, "embedding", 4, ranges=Ranges(ranges))
    body = {"texts": ["a"], "precision": "int8"}
    got = incoming(body, JSON, limits=ranged).outcome
    vector = np.array([-1.0, 0.0, 0.5, 1.0], dtype=np.float32)
    expected = quantization.quantize_embeddings(vector[None, :], "int8", ranges=ranges)[0].tolist()
    assert got.render([answer(vector)])[0]["embedding"] == expected == [-128, -1, 63, 126]  # its float32 steps
    refused = incoming(body, JSON).outcome
    assert isinstance(refused, RequestError) and "embedding_ranges.json" in refused.message


def test_a_ranges_file_is_refused_in_one_line_for_anything_but_numbers(tmp_path):
    """One parser (`load_ranges`), the build's and the worker's: strings and booleans are no numbers (numpy would
    have read "0.5" and true), NaN and Infinity no JSON numbers, a span float32 cannot hold no model's ranges (every
    int8 answer was -128), and a file that is not UTF-8 is a line, not a traceback."""
    from bucketing.quantize import load_ranges, parse_ranges

    for data, says in [
        ({"minimums": ["0.5", 0], "maximums": [1, 1]}, "lists of numbers"),
        ({"minimums": [False, 0], "maximums": [True, 1]}, "lists of numbers"),
        ({"minimums": [0, [0]], "maximums": [1, 1]}, "lists of numbers"),
        ({"minimums": [-3e38, 0], "maximums": [3e38, 1]}, "overflows float32"),
        ({"minimums": [0, 0], "maximums": [1, 1], "texts": "9"}, '"texts" must be'),
        ({"minimums": [0, 0], "maximums": [1, 1], "embeddings": [[0, 1]]}, "at least 2 finite vectors of 2"),
        ({"minimums": [0, 0], "maximums": [1, 1], "embeddings": [[0, "1"], [1, 1]]}, "calibration vectors"),
    ]:
        with pytest.raises(ValueError, match=says) as caught:
            parse_ranges(data, 2)
        assert "\n" not in str(caught.value)
    path = tmp_path / "embedding_ranges.json"
    for text, says in [
        ('{"minimums": [NaN, 0], "maximums": [1, 1]}', "NaN is not a number JSON allows"),
        ('{"minimums": [0, 0], "maximums": [Infinity, 1]}', "Infinity is not a number JSON allows"),
        ('{"minimums": [0, 0], ', "is not JSON"),
    ]:
        path.write_text(text)
        with pytest.raises(ValueError, match=says):
            load_ranges(path, 2)
    path.write_bytes(b'{"minimums": [0, 0], "maximums": [1, 1], "note": "\xff"}')
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        load_ranges(path, 2)
    path.write_text('{"minimums": [0, -1], "maximums": [1, 1], "texts": 2, "embeddings": [[0, -1], [1, 1]]}')
    kept = load_ranges(path, None)
    assert kept.bounds.tolist() == [[0, -1], [1, 1]] and kept.calibration.shape == (2, 2)


@pytest.mark.parametrize("name", ["int8", "uint8"])
@pytest.mark.parametrize("cut", [1, 3, 8])
def test_a_renormalised_cut_takes_the_ranges_sentence_transformers_calibrates_on_that_cut(name, cut):
    """`dimensions` re-normalises the cut vector, whose components are larger than the uncut ones: its ranges are
    the calibration vectors' cut and re-normalised (as `quantize_embeddings(cut, calibration_embeddings=cut
    calibration)`), where the uncut ranges' first components clipped a share that grew as the cut shrank."""
    rng = np.random.default_rng(7)
    calibration = rng.standard_normal((64, 12)).astype(np.float32)
    calibration /= np.linalg.norm(calibration, axis=1, keepdims=True)
    ranges = Ranges(np.stack([calibration.min(axis=0), calibration.max(axis=0)]), calibration)
    served = rng.standard_normal((16, 12)).astype(np.float32)
    served /= np.linalg.norm(served, axis=1, keepdims=True)

    def renormalised(rows):
        rows = rows[:, :cut]
        return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), np.float32(1e-12))

    vectors = renormalised(served)
    got = np.stack([PRECISIONS[name].apply(v, ranges.fit(cut, True)) for v in vectors])
    expected = quantization.quantize_embeddings(vectors, name, calibration_embeddings=renormalised(calibration))
    assert got.tolist() == expected.tolist()
    assert ranges.fit(cut, True) is ranges.fit(cut, True)  # derived once per cut size
    assert ranges.fit(cut, False) is ranges.bounds and ranges.fit(12, True) is ranges.bounds  # values kept: uncut's


def test_int8_of_a_renormalised_cut_is_refused_where_the_file_keeps_no_calibration_vectors():
    """A ranges file written before the calibration vectors were kept cannot fit a re-normalised cut: the client's
    400 in one line, naming the fix, rather than clipped values; values cut but not re-normalised are answered."""
    from dataclasses import replace

    bounds = np.array([[-1.0] * 4, [1.0] * 4], dtype=np.float32)
    old = Limits(4, 16, 1000, "embedding", 4, ranges=Ranges(bounds))
    refused = incoming({"texts": ["a"], "precision": "int8", "dimensions": 2}, JSON, limits=old).outcome
    assert isinstance(refused, RequestError) and refused.status == 400
    assert '"precision" int8 with "dimensions" 2 (re-normalised) needs ranges of that cut' in refused.message
    assert "python -m model_store.ranges" in refused.message and "\n" not in refused.message
    for body in (
        {"texts": ["a"], "precision": "int8", "dimensions": 2, "normalize": False},
        {"texts": ["a"], "precision": "int8"},
        {"texts": ["a"], "precision": "binary", "dimensions": 2},
    ):
        assert not isinstance(incoming(body, JSON, limits=old).outcome, RequestError), body
    cohere = {"texts": ["a"], "embedding_types": ["int8"], "output_dimension": 2, "input_type": "search_query"}
    refused = incoming(cohere, JSON, url_path="v2/embed", limits=old).outcome
    assert isinstance(refused, RequestError) and '"embedding type" int8 with "output_dimension" 2' in refused.message
    calibrated = replace(old, ranges=Ranges(bounds, np.eye(4, dtype=np.float32)))
    assert not isinstance(incoming(cohere, JSON, url_path="v2/embed", limits=calibrated).outcome, RequestError)
