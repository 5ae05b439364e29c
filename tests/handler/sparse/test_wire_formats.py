"""Sparse answers in our format, OpenAI's, KServe v1's and TEI's /embed_sparse and /info; what is refused, in
one line in each format (a dense model's /embed_sparse too)."""

from __future__ import annotations

import json

import pytest

from tests.handler.sparse.support import mismatches, reference, texts_for
from tests.handler.test_handler import make_handler, serve_at

pytest.importorskip("sentence_transformers")


def test_openai_and_tei_answer_sparse_shapes(folders, handlers):
    handler, context = handlers("splade-sum-log1p")
    texts = texts_for("splade-sum-log1p", "query")
    rows = [
        {"input": texts, "model": "m", "input_type": "query"},
        {"inputs": texts, "prompt_name": "query"},
        {"inputs": texts[0]},
    ]
    ((status, info),) = serve_at(handler, context, [None], ["info"])
    assert status == 200 and info["model_type"] == {"embedding": {"pooling": "splade"}}
    (s1, openai), (s2, tei), (s3, single) = serve_at(
        handler, context, rows, ["v1/embeddings", "embed_sparse", "embed_sparse"]
    )
    assert (s1, s2, s3) == (200, 200, 200)
    expected = reference(folders["splade-sum-log1p"], texts, "query")
    assert mismatches([d["embedding"] for d in openai["data"]], expected) == 0
    as_lists = [{"indices": [p["index"] for p in a], "values": [p["value"] for p in a]} for a in tei]
    assert mismatches(as_lists, expected) == 0
    ((status, v1),) = serve_at(handler, context, [{"instances": texts[:2]}], [""])
    assert status == 200
    assert (
        mismatches([p["embedding"] for p in v1["predictions"]], reference(folders["splade-sum-log1p"], texts[:2])) == 0
    )
    plain = reference(folders["splade-sum-log1p"], texts[:1])
    assert (
        len(single) == 1
        and mismatches([{"indices": [p["index"] for p in single[0]], "values": [p["value"] for p in single[0]]}], plain)
        == 0
    )


def test_refusals_are_one_line_in_each_format(handlers):
    handler, context = handlers("router")
    rows = [
        {"texts": ["a"], "input_type": "passage"},
        {"input": "a", "input_type": "queries"},
        {"input": "a", "encoding_format": "base64"},
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
        {"inputs": "a"},
        {"texts": ["a"], "normalize": True},
        {"texts": ["a"], "max_active_dims": 0},
    ]
    paths = ["", "v1/embeddings", "v1/embeddings", "", "embed", "", ""]
    answers = serve_at(handler, context, rows, paths)
    statuses = [s for s, _ in answers]
    assert statuses == [400, 400, 400, 400, 424, 400, 400], answers
    assert "input_type" in answers[0][1]["message"]
    assert answers[1][1]["error"]["param"] == "input_type"
    assert answers[2][1]["error"]["param"] == "encoding_format"
    assert "sparse" in answers[3][1]["message"] and "embed_sparse" in answers[4][1]["error"]
    for _, body in answers:
        assert "\n" not in json.dumps(body)


def test_a_dense_model_refuses_embed_sparse(tiny_embedder_dir):
    handler, context = make_handler(tiny_embedder_dir, max_length=64)
    ((status, body),) = serve_at(handler, context, [{"inputs": "a"}], ["embed_sparse"])
    assert status == 424 and body["error_type"] == "Backend"


def test_a_csr_model_is_named_a_sparse_model_in_refusals(csr_folders):
    handler, context = make_handler(csr_folders["csr-dense-normalized"], task="sparse", max_length=64)
    rows = [{"inputs": "a"}, {"inputs": "a"}, {"pairs": [["a", "b"]]}]
    answers = serve_at(handler, context, rows, ["embed", "predict", ""])
    assert [s for s, _ in answers] == [424, 424, 400], answers
    for _, body in answers:
        line = body.get("error") if isinstance(body.get("error"), str) else body["message"]
        assert "this is a sparse model" in line and "SPLADE" not in line, line
