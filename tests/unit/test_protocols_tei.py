"""Text Embeddings Inference's routes, parsed and answered as TEI's router does (field names, defaults, shapes,
error types and status codes), with a fake tokenizer: pure, no model."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from bucketing import protocols
from bucketing.answers import Answer
from bucketing.protocols import (
    kserve_v2,
    tei,
    tei_default,
    tei_embed,
    tei_embed_all,
    tei_embed_sparse,
    tei_predict,
    tei_similarity,
)
from bucketing.protocols.base import (
    BadRequest,
    FailedDependency,
    Limits,
    Meta,
    NotFound,
    Pair,
    RequestError,
    ServerError,
    TooLarge,
)
from bucketing.protocols.tei_embed import EmbedRequest
from bucketing.protocols.tei_predict import PredictRequest
from bucketing.protocols.tei_similarity import SimilarityRequest
from bucketing.quantize import Ranges

JSON = "application/json"


class FakeTools:
    """Whitespace words as tokens, [CLS] and [SEP] around them; ids are word lengths."""

    def tokenize(self, text, add_special_tokens):
        tokens, at = [], 0
        for word in text.split():
            start = text.index(word, at)
            at = start + len(word)
            tokens.append({"id": len(word), "text": word, "special": False, "start": start, "stop": at})
        if add_special_tokens:
            special = {"text": "[CLS]", "special": True, "start": None, "stop": None}
            tokens = [{"id": 101, **special}, *tokens, {"id": 102, **special, "text": "[SEP]"}]
        return tokens

    def decode(self, ids, skip_special_tokens):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i >= 100))


def facts(labels=None, pooling=("mean",)):
    return tei.ModelFacts("float32", None if labels else pooling, labels, 8192, True, 100, FakeTools())


EMBEDDER = Limits(4, 16, 1000, "embedding", 4, prompts=(("query", "query: "),), model=facts())
CLASSIFIER = Limits(4, 16, 1000, "classification", 3, model=facts(("neg", "neu", "pos")))
RERANKER = Limits(4, 16, 1000, "classification", 1, model=facts(("score",)))


def incoming(body, url_path="", limits=EMBEDDER):
    return protocols.parse({"body": body}, Meta(JSON, url_path), limits)


def reply(body, url_path="", limits=EMBEDDER, answers=()):
    out = incoming(body, url_path, limits).reply(list(answers), "tiny", 10**6)
    return out.status, json.loads(out.body)


def vector(values, normalize=False):
    return Answer(np.asarray(values, dtype=np.float32), 3, False, None, "identity", normalize)


def logits(values, labels=("neg", "neu", "pos")):
    return Answer(np.asarray(values, dtype=np.float32), 3, False, labels, "identity")


def test_embed_a_string_answers_a_list_of_one_list():
    request = incoming({"inputs": "hello"}, "embed").outcome
    assert request == EmbedRequest(("hello",), single=True)
    status, body = reply({"inputs": "hello"}, "embed", answers=[vector([3, 4, 0, 0])])
    assert status == 200 and body == [[3.0, 4.0, 0.0, 0.0]]


def test_embed_a_list_with_every_option():
    body = {
        "inputs": ["a", "b"],
        "normalize": True,
        "truncate": False,
        "truncation_direction": "Left",
        "prompt_name": "query",
        "dimensions": 2,
        "encoding_format": "float",  # what InferenceClient may add; TEI ignores unknown fields
    }
    request = incoming(body, "embed").outcome
    assert isinstance(request, EmbedRequest) and request.inputs == ("a", "b") and not request.single
    o = request.options
    assert (o.normalize, o.truncate, o.truncation_direction, o.prompt, o.dimensions) == (
        True,
        False,
        "left",
        "query: ",
        2,
    )
    status, answered = reply(body, "embed", answers=[vector([3, 4, 1, 1]), vector([0, 2, 5, 5])])
    assert status == 200 and np.allclose(answered, [[0.6, 0.8], [0.0, 1.0]], atol=1e-7)


def test_normalize_absent_is_the_models_own():
    status, body = reply({"inputs": ["a"]}, "embed", answers=[vector([3, 4, 0, 0], normalize=True)])
    assert np.allclose(body, [[0.6, 0.8, 0.0, 0.0]], atol=1e-7)
    status, body = reply({"inputs": ["a"], "normalize": False}, "embed", answers=[vector([3, 4, 0, 0], True)])
    assert body == [[3.0, 4.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    "body, status, error_type, words",
    [
        ({"inputs": []}, 400, "Empty", "`inputs` cannot be empty"),
        ({"inputs": ["a"] * 5}, 422, "Validation", "batch size 5 > maximum allowed batch size 4"),
        ({"texts": ["a"]}, 422, "Validation", "missing field `inputs`"),
        ({"inputs": 5}, 422, "Validation", "must be a string or a list of strings"),
        ({"inputs": [1, 2]}, 422, "Validation", "token ids are served at v1/embeddings"),
        ({"inputs": ["a", " "]}, 422, "Validation", "inputs[1] is empty"),
        ({"inputs": "a", "normalize": "yes"}, 422, "Validation", '"normalize" must be true or false'),
        ({"inputs": "a", "dimensions": 9}, 422, "Validation", '"dimensions" must be an integer from 1 to 4'),
        ({"inputs": "a", "truncation_direction": "up"}, 422, "Validation", "truncation_direction"),
        ({"inputs": "a", "prompt_name": "doc"}, 422, "Validation", "is not a prompt of this model"),
        (["a"], 422, "Validation", "expected a JSON object"),
    ],
)
def test_embed_mistakes_in_teis_shape_and_codes(body, status, error_type, words):
    got_status, got = reply(body, "embed")
    assert got_status == status and set(got) == {"error", "error_type"}, got
    assert got["error_type"] == error_type and words in got["error"]


def test_embed_on_a_classifier_and_predict_on_an_embedder_are_backend_424s():
    status, body = reply({"inputs": "a"}, "embed", CLASSIFIER)
    assert status == 424 and body["error_type"] == "Backend" and "Model is not an embedding model" in body["error"]
    status, body = reply({"inputs": "a"}, "predict", EMBEDDER)
    assert status == 424 and body["error_type"] == "Backend" and "Model is not a classifier model" in body["error"]


@pytest.mark.parametrize(
    "inputs, parsed, single",
    [
        ("a", ("a",), True),
        (["a"], ("a",), True),
        (["a", "b"], (Pair("a", "b"),), True),
        ([["a"], ["a", "b"]], ("a", Pair("a", "b")), False),
    ],
)
def test_predict_reads_inputs_as_tei_does(inputs, parsed, single):
    request = incoming({"inputs": inputs, "raw_scores": True}, "predict", CLASSIFIER).outcome
    assert isinstance(request, PredictRequest)
    assert (request.inputs, request.single, request.options.raw_scores) == (parsed, single, True)


@pytest.mark.parametrize(
    "inputs, words",
    [
        (["a", "b", "c"], "must be a string, a pair"),
        ([["a", "b", "c"]], "inputs[0] must be"),
        ([["a"], "b"], "inputs[1] must be"),
        ([[]], "inputs[0] must be"),
        ([["a"]] * 5, "batch size 5 > maximum allowed batch size 4"),
    ],
)
def test_predict_mistakes_are_422s(inputs, words):
    status, body = reply({"inputs": inputs}, "predict", CLASSIFIER)
    assert status == 422 and body["error_type"] == "Validation" and words in body["error"], body


def test_predict_answers_labels_best_first_one_list_or_a_batch():
    status, one = reply({"inputs": "a"}, "predict", CLASSIFIER, [logits([0.1, 0.7, 0.2])])
    assert status == 200 and [p["label"] for p in one] == ["neu", "pos", "neg"]
    assert [round(p["score"], 6) for p in one] == [0.7, 0.2, 0.1] and set(one[0]) == {"label", "score"}
    status, batch = reply(
        {"inputs": [["a"], ["b", "c"]]}, "predict", CLASSIFIER, [logits([1, 2, 3]), logits([3, 2, 1])]
    )
    assert [[p["label"] for p in ranked] for ranked in batch] == [["pos", "neu", "neg"], ["neg", "neu", "pos"]]
    status, only = reply({"inputs": "a"}, "predict", RERANKER, [logits([0.25], ("score",))])
    assert only == [{"score": 0.25, "label": "score"}]


def test_tokenize_a_string_or_a_list_with_the_prompt_and_specials():
    status, body = reply({"inputs": "hi there"}, "tokenize")
    assert status == 200 and [[t["text"] for t in tokens] for tokens in body] == [["[CLS]", "hi", "there", "[SEP]"]]
    assert body[0][1] == {"id": 2, "text": "hi", "special": False, "start": 0, "stop": 2}
    assert body[0][0]["start"] is None and body[0][0]["special"] is True
    status, body = reply({"inputs": ["a", "b c"], "add_special_tokens": False, "prompt_name": "query"}, "tokenize")
    assert [[t["text"] for t in tokens] for tokens in body] == [["query:", "a"], ["query:", "b", "c"]]


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"inputs": []}, 400, "`inputs` cannot be empty"),
        ({"inputs": "a", "add_special_tokens": 1}, 422, "add_special_tokens"),
        ({"inputs": "x" * 101}, 422, "/tokenize reads at most 100"),
        ({"inputs": "a", "prompt_name": "nope"}, 422, "not a prompt"),
    ],
)
def test_tokenize_mistakes(body, status, words):
    got_status, got = reply(body, "tokenize")
    assert got_status == status and words in got["error"], got


def test_decode_one_list_or_a_batch():
    assert reply({"ids": [101, 5, 7, 102]}, "decode") == (200, ["5 7"])
    assert reply({"ids": [[101, 5], [7]], "skip_special_tokens": False}, "decode") == (200, ["101 5", "7"])
    assert reply({"ids": []}, "decode") == (200, [""])


@pytest.mark.parametrize(
    "body, words",
    [
        ({"ids": [1, 1000]}, "`ids`[1] must be a token id of this model's vocabulary (0 to 999), got 1000"),
        ({"ids": [[1], [-1]]}, "ids[1][0] must be a token id"),
        ({"ids": [[1]] * 5}, "batch size 5 > maximum allowed batch size 4"),
        ({"ids": "1 2"}, "must be a list of token ids"),
        ({"ids": [1], "skip_special_tokens": "no"}, "skip_special_tokens"),
        ({"tokens": [1]}, "missing field `ids`"),
    ],
)
def test_decode_mistakes_are_422s(body, words):
    status, got = reply(body, "decode")
    assert status == 422 and got["error_type"] == "Validation" and words in got["error"], got


def test_info_for_each_model_kind():
    status, info = reply(None, "info")
    assert status == 200 and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert (info["model_id"], info["max_input_length"], info["max_client_batch_size"]) == ("tiny", 16, 4)
    assert (info["model_dtype"], info["max_batch_tokens"], info["auto_truncate"]) == ("float32", 8192, True)
    assert {"tokenization_workers", "version", "model_sha", "max_concurrent_requests"} <= set(info)
    _, info = reply(None, "info", CLASSIFIER)
    labels = {"id2label": {"0": "neg", "1": "neu", "2": "pos"}, "label2id": {"neg": 0, "neu": 1, "pos": 2}}
    assert info["model_type"] == {"classifier": labels}
    _, info = reply(None, "info", RERANKER)
    assert info["model_type"] == {"reranker": {"id2label": {"0": "score"}, "label2id": {"score": 0}}}
    assert facts(pooling=("lasttoken",)).model_type() == {"embedding": {"pooling": "last_token"}}
    assert info["embedding_ranges"] is None
    ranges = np.array([[-1.0, -0.5, 0.0, 0.0], [1.0, 0.5, 0.25, 0.0]], dtype=np.float32)
    _, info = reply(None, "info", replace(EMBEDDER, ranges=Ranges(ranges)))
    assert info["embedding_ranges"] == ranges.tolist()  # the model's fixed int8/uint8 [minimums, maximums]


def test_info_of_a_model_that_pools_no_tokens_says_none():
    """A multi-vector model's chain pools nothing (one vector per token): TEI has no such model type, so /info says
    an embedding model with pooling "none" (was "mean", which told a client /embed answers one vector a text)."""
    assert facts(pooling=()).model_type() == {"embedding": {"pooling": "none"}}
    assert facts(pooling=("splade",)).model_type() == {"embedding": {"pooling": "splade"}}  # TEI's own name
    assert facts(pooling=("csr",)).model_type() == {"embedding": {"pooling": "csr"}}  # a SparseAutoEncoder model


@pytest.mark.parametrize(
    "path, words, wire", [("embed_sparse", "SPLADE", tei_embed_sparse), ("embed_all", "multi-vector", tei_embed_all)]
)
def test_sparse_and_token_embeddings_on_a_dense_model_are_refused_in_one_line(path, words, wire):
    result = incoming({"inputs": "a"}, path)
    assert result.wire is wire.WIRE
    status, body = reply({"inputs": "a"}, path)
    assert status == 424 and body["error_type"] == "Backend" and words in body["error"] and "\n" not in body["error"]


@pytest.mark.parametrize(
    "body, limits, wire, kind",
    [
        ({"inputs": "a"}, EMBEDDER, tei_default, EmbedRequest),
        ({"inputs": ["a", "b"], "normalize": False}, EMBEDDER, tei_default, EmbedRequest),
        ({"inputs": [1, 2]}, EMBEDDER, tei_default, RequestError),  # TEI's token ids: TEI's, refused in its shape
        ({"inputs": "a", "parameters": {"top_k": 1}}, CLASSIFIER, tei_default, PredictRequest),
        ({"inputs": [["a", "b"]]}, CLASSIFIER, tei_default, PredictRequest),
        ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}, EMBEDDER, kserve_v2, None),
        ({"inputs": []}, EMBEDDER, kserve_v2, RequestError),  # no shape to tell: left to v2, the older claim
    ],
)
def test_the_plain_path_tells_tei_from_kserve_v2_by_the_shape_of_inputs(body, limits, wire, kind):
    result = incoming(body, "", limits)
    assert result.wire is wire.WIRE
    if kind is not None:
        assert isinstance(result.outcome, kind)


def test_the_plain_path_takes_teis_rerank_body_for_a_one_label_model():
    result = incoming({"query": "q", "texts": ["a", "b"]}, "", RERANKER)
    assert result.wire is tei_default.WIRE and result.outcome.inputs == (Pair("q", "a"), Pair("q", "b"))
    status, body = reply({"query": "q", "texts": ["a"]}, "", CLASSIFIER)  # TEI: "model is not a re-ranker model"
    assert status == 424 and body["error_type"] == "Backend" and "one-label classification models" in body["error"]


@pytest.mark.parametrize(
    "error, status, error_type",
    [
        (BadRequest("InvalidType", "x"), 422, "Validation"),
        (TooLarge("TextTooLong", "x"), 422, "Validation"),
        (TooLarge("ResponseTooLarge", "x"), 413, "Validation"),
        (ServerError("InternalServerError", "x"), 500, "Backend"),
        (BadRequest("Empty", "x"), 400, "Empty"),
        (FailedDependency("Backend", "x"), 424, "Backend"),
        (NotFound("NotFound", "x"), 424, "Backend"),
    ],
)
def test_our_errors_as_tei_types_them(error, status, error_type):
    own = tei.own_error(error)
    assert (own.status, own.type) == (status, error_type)
    assert tei_embed.error_body(own) == {"error": "x", "error_type": error_type}


def test_a_text_over_max_length_refused_is_teis_422_and_an_answer_too_large_a_413():
    refused = incoming({"inputs": "a"}, "embed").fail(TooLarge("TextTooLong", "inputs[0] too long"))
    out = refused.reply([], "tiny", 10**6)
    assert out.status == 422 and json.loads(out.body)["error_type"] == "Validation"
    big = incoming({"inputs": "a"}, "embed").reply([vector([1.0] * 4)], "tiny", 10)
    assert big.status == 413 and json.loads(big.body)["error_type"] == "Validation"


def test_byte_offsets_count_utf8_bytes():
    assert tei.byte_offsets("aé€") == [0, 1, 3, 6]
    assert tei_predict.SHAPE in incoming({"inputs": 5}, "predict", CLASSIFIER).outcome.message


def test_similarity_is_the_cosine_with_the_source_at_its_route_and_the_plain_path():
    body = {"inputs": {"source_sentence": "s", "sentences": ["a", "b"]}, "parameters": {"prompt_name": "query"}}
    for path in ("similarity", ""):
        result = incoming(body, path)
        assert result.wire is (tei_similarity if path else tei_default).WIRE
        assert result.outcome == SimilarityRequest(("s", "a", "b"), result.outcome.options)
        assert result.outcome.options.prompt == "query: "
    answers = [vector([1, 0, 0, 0]), vector([2, 2, 0, 0]), vector([0, 0, 3, 0])]
    status, scores = reply(body, "similarity", answers=answers)
    assert status == 200 and np.allclose(scores, [2**-0.5, 0.0])


@pytest.mark.parametrize(
    "inputs, status, words",
    [
        ({"source_sentence": "s", "sentences": []}, 400, "`inputs.sentences` cannot be empty"),
        ({"source_sentence": "s", "sentences": ["a"] * 4}, 422, "batch size 5 > maximum allowed batch size 4"),
        ({"source_sentence": 1, "sentences": ["a"]}, 422, "`inputs.source_sentence` must be a string"),
        ({"source_sentence": "s", "sentences": "a"}, 422, "`inputs.sentences` must be a list of strings"),
        ({"source_sentence": "s", "sentences": ["a", ""]}, 422, "inputs.sentences[1] is empty"),
        ("s", 422, "`inputs` must be an object"),
    ],
)
def test_similarity_mistakes(inputs, status, words):
    got_status, got = reply({"inputs": inputs}, "similarity")
    assert got_status == status and words in got["error"], got


SPARSE = Limits(4, 16, 1000, "sparse", 1000, model=facts(pooling=("splade",)))
MULTIVECTOR = Limits(4, 16, 1000, "multivector", 4, model=facts(pooling=()))
ROUTE_NAMES = {
    "/embed": "TEI's embed route",
    "/embed_sparse": "TEI's sparse route",
    "/predict": "TEI's classification route",
    "/embed_all": "TEI's token-embeddings route",
}


@pytest.mark.parametrize(
    "limits, serving",
    [(EMBEDDER, "/embed"), (SPARSE, "/embed_sparse"), (CLASSIFIER, "/predict"), (MULTIVECTOR, "/embed_all")],
)
@pytest.mark.parametrize("path", ["embed", "embed_sparse", "embed_all", "predict"])
def test_a_refused_tei_route_names_the_route_that_serves_the_model(limits, serving, path):
    """A model asked at a TEI route of another kind is told the one TEI route that answers it (a sparse model at
    /embed_all or /predict was sent to /embed, a classifier at /embed_all too)."""
    if serving == f"/{path}":
        assert not isinstance(incoming({"inputs": "a"}, path, limits).outcome, RequestError)
        return
    status, body = reply({"inputs": "a"}, path, limits)
    if limits is MULTIVECTOR and path != "embed_all":  # the wire format does not admit it: its own kind's line
        assert status == 422 and ".../embed_all (TEI)" in body["error"], body
    else:
        assert status == 424 and body["error_type"] == "Backend", body
        assert body["error"].endswith(f"this is {limits.kind.a_model}, served at {serving} ({ROUTE_NAMES[serving]})")
