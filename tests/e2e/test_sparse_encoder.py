"""A sparse encoder through a real TorchServe: a tiny Router (a static query route, a SPLADE document route) saved by
sentence-transformers, built with one command (its task detected from the folder), answers our JSON, OpenAI's and
TEI's /embed_sparse at once, each equal to SparseEncoder's encode_query / encode_document / encode."""

from __future__ import annotations

import numpy as np
import pytest

from model_store import build
from tests.e2e.conftest import call_all
from tests.e2e.test_serving import texts_for_load
from tests.models import build_sparse_encoder

pytestmark = pytest.mark.e2e


def test_a_sparse_router_serves_what_sparse_encoder_encodes(torchserve, model_store, tmp_path):
    from sentence_transformers import SparseEncoder

    folder = build_sparse_encoder(tmp_path / "router", router=True, pooling="sum", max_active_dims=32)
    name = "tiny-sparse"
    argv = ["--model-dir", str(folder), "--name", name, "--strategies", "bucketed", "--out", str(model_store)]
    assert build.main(argv) == 0
    client = torchserve.client
    client.register(f"{name}-bucketed.mar", name, batch_size=8, max_batch_delay=50, workers=1)
    texts = [" ".join(t.split()[:30]) for t in texts_for_load(6, seed=6)]
    calls = [
        (f"/predictions/{name}", {"texts": texts, "input_type": "query"}),
        (f"/predictions/{name}", {"texts": texts, "input_type": "document"}),
        (f"/predictions/{name}/1.0/v1/embeddings", {"input": texts, "model": name}),
        (f"/predictions/{name}/1.0/embed_sparse", {"inputs": texts}),
    ]
    kinds = ["query", "document", None, None]  # the encode each call's answer equals
    try:
        replies = call_all(client, calls)
        for reply in replies:
            assert reply.status == 200, reply.body[:300]
        model = SparseEncoder(str(folder), device="cpu")
        encode = {"query": model.encode_query, "document": model.encode_document, None: model.encode}
        native_q, native_d, openai, tei = (r.json() for r in replies)
        answers = [
            [a["embedding"] for a in native_q],
            [a["embedding"] for a in native_d],
            [d["embedding"] for d in openai["data"]],
            [{"indices": [p["index"] for p in a], "values": [p["value"] for p in a]} for a in tei],
        ]
        for kind, got in zip(kinds, answers, strict=True):
            expected = encode[kind](texts, convert_to_tensor=True).to_dense().numpy()
            for answer, row in zip(got, expected, strict=True):
                ids = np.flatnonzero(row)
                assert answer["indices"] == ids.tolist()
                assert np.max(np.abs(np.array(answer["values"]) - row[ids])) <= 1e-5
    finally:
        client.unregister(name)
