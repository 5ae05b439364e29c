"""SPLADE (max and sum pooling, relu and log1p_relu) and Router folders through the handler in process: every
answer has the non-zero ids of `SparseEncoder(dir).encode()`, `encode_query()` or `encode_document()` (the request's
`input_type`) and their values within 1e-5, on both engines (onnxruntime: the graph an archive built with --engine
onnxruntime carries), in every strategy and batch split, cut to the model's or the request's max_active_dims; rows of
different input types in one batch; token ids on their request's route."""

from __future__ import annotations

import pytest

from tests.handler.sparse.support import ENGINES, VARIANTS, mismatches, reference, texts_for
from tests.handler.test_handler import serve_at

pytest.importorskip("sentence_transformers")


def exactness_cases() -> list[tuple[str, str | None, str, str]]:
    """Every variant, input type and strategy on torch; on onnxruntime each in every strategy too, but the input
    types of a variant that has neither prompts nor a Router (they give its graph the same rows as encode())."""
    return [
        (variant, input_type, strategy, engine)
        for variant, spec in VARIANTS.items()
        for input_type in (None, "query", "document")
        for strategy in ("bucketed", "dynamic", "static")
        for engine in ENGINES
        if engine == "torch" or input_type is None or spec.get("prompts") or spec.get("router")
    ]


@pytest.mark.parametrize(("variant", "input_type", "strategy", "engine"), exactness_cases())
def test_answers_equal_sparse_encoder(folders, handlers, variant, input_type, strategy, engine):
    handler, context = handlers(variant, strategy, engine)
    texts = texts_for(variant, input_type)
    options = {"input_type": input_type} if input_type else {}
    rows = [{"texts": texts[:3], **options}, {"texts": texts[3:], **options}, {"text": texts[-3], **options}]
    answers = serve_at(handler, context, rows, ["", "", ""])
    assert [s for s, _ in answers] == [200, 200, 200], answers
    got = [e["embedding"] for e in answers[0][1] + answers[1][1]] + [answers[2][1]["embedding"]]
    assert mismatches(got, reference(folders[variant], texts + [texts[-3]], input_type)) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_requests_of_different_input_types_share_a_batch(folders, handlers, engine):
    """A Router's query and document rows in one delivered batch (one pass plan) each take their own route."""
    handler, context = handlers("router", engine=engine, max_batch_tokens=256, max_response_bytes=1 << 27)
    queries, documents = texts_for("router", "query", seed=7), texts_for("router", "document", seed=8)
    rows = [
        {"texts": queries, "input_type": "query"},
        {"texts": documents, "input_type": "document"},
        {"texts": documents},
    ]
    (s1, q), (s2, d), (s3, n) = serve_at(handler, context, rows, ["", "", ""])
    assert (s1, s2, s3) == (200, 200, 200)
    folder = folders["router"]
    assert mismatches([a["embedding"] for a in q], reference(folder, queries, "query")) == 0
    assert mismatches([a["embedding"] for a in d], reference(folder, documents, "document")) == 0
    assert mismatches([a["embedding"] for a in n], reference(folder, documents)) == 0


@pytest.mark.parametrize("variant", ["splade-max", "router-top"])
def test_a_request_max_active_dims_cuts_as_encode_does(folders, handlers, variant):
    handler, context = handlers(variant)
    texts = texts_for(variant, "document")
    ((status, body),) = serve_at(handler, context, [{"texts": texts, "max_active_dims": 7}], [""])
    assert status == 200
    got = [a["embedding"] for a in body]
    assert all(len(a["indices"]) <= 7 for a in got)
    assert mismatches(got, reference(folders[variant], texts, max_active_dims=7)) == 0


def test_token_ids_take_their_requests_route(folders, handlers):
    """Token ids (OpenAI's `input` of integers) take the route of their request's input_type, as its texts do."""
    handler, context = handlers("router-top")  # no prompts (token ids take none)
    texts = ["apple cherry alpha", "word " * 40]
    ids = [list(e.ids[1:-1]) for e in handler.tokenizer.encode(texts)]
    rows = [{"input": ids, "model": "m", "input_type": t} for t in ("query", "document")]
    (s1, queries), (s2, documents) = serve_at(handler, context, rows, ["v1/embeddings", "v1/embeddings"])
    assert (s1, s2) == (200, 200)
    folder = folders["router-top"]
    assert mismatches([d["embedding"] for d in queries["data"]], reference(folder, texts, "query")) == 0
    assert mismatches([d["embedding"] for d in documents["data"]], reference(folder, texts, "document")) == 0
