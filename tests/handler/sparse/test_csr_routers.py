"""Routers with CSR routes (beside a static route; two over one shared Transformer; two sharing one
autoencoder): each request's route as encode_query / encode_document / encode() takes it, rows of both routes in
one batch; a Router of SPLADE and CSR routes, or with unreadable static weights, refused in one line."""

from __future__ import annotations

import pytest

from tests.handler.sparse.support import CSR_ROUTERS, MAX_LENGTH, build_csr_router, mismatches, reference
from tests.handler.test_handler import make_handler, mixed_texts, serve_at

sentence_transformers = pytest.importorskip("sentence_transformers")


def csr_router_texts(input_type, seed=6):
    """Varied lengths, some over max_length; a static query route's short (a long one: see its own test)."""
    texts = mixed_texts(9, seed=seed) + ["short", "x"]
    return [" ".join(t.split()[:20]) for t in texts] if input_type == "query" else texts


@pytest.mark.parametrize("strategy", ["bucketed", "dynamic", "static"])
@pytest.mark.parametrize("input_type", [None, "query", "document"])
@pytest.mark.parametrize(
    ("variant", "engine"),
    [("csr-static-router", "torch"), ("csr-static-router", "onnxruntime"), ("csr-shared-router", "torch")],
)
def test_csr_router_answers_equal_sparse_encoder(csr_routers, archives, variant, engine, input_type, strategy):
    """A Router with CSR routes (beside a static route, or two over one shared Transformer; a Pooling that leaves
    the prompt out): each request's route as encode_query / encode_document / encode() takes it, a CSR route cut
    at its own k (SparseEncoder takes no max_active_dims from a SparseAutoEncoder inside a Router); one CSR route
    on either engine (several: torch only, `test_several_csr_routes_are_refused_on_onnxruntime_in_one_line`)."""
    folder = csr_routers[variant]
    served = folder if engine == "torch" else archives(variant)[0]
    handler, context = make_handler(served, task="sparse", strategy=strategy, engine=engine, max_length=MAX_LENGTH)
    texts = csr_router_texts(input_type)
    options = {"input_type": input_type} if input_type else {}
    rows = [{"texts": texts[:4], **options}, {"texts": texts[4:], **options}, {"text": texts[2], **options}]
    answers = serve_at(handler, context, rows, ["", "", ""])
    assert [s for s, _ in answers] == [200, 200, 200], answers
    got = [e["embedding"] for e in answers[0][1] + answers[1][1]] + [answers[2][1]["embedding"]]
    assert mismatches(got, reference(folder, texts + [texts[2]], input_type)) == 0


@pytest.mark.parametrize("max_active_dims", [3, 20])
@pytest.mark.parametrize("variant", list(CSR_ROUTERS))
def test_csr_router_rows_of_both_routes_share_a_batch(csr_routers, variant, max_active_dims):
    """Query and document rows (and encode()'s) in one delivered batch, each by its route, a request's
    max_active_dims cutting each as encode(max_active_dims=...) does (over a CSR route's k as well as under it)."""
    folder = csr_routers[variant]
    handler, context = make_handler(folder, task="sparse", max_length=MAX_LENGTH, max_batch_tokens=256)
    queries, documents = csr_router_texts("query", seed=7), csr_router_texts("document", seed=8)
    rows = [
        {"texts": queries, "input_type": "query"},
        {"texts": documents, "input_type": "document", "max_active_dims": max_active_dims},
        {"texts": documents[:5]},
        {"texts": queries[:5], "input_type": "query", "max_active_dims": max_active_dims},
    ]
    answers = serve_at(handler, context, rows, [""] * 4)
    assert [s for s, _ in answers] == [200] * 4, answers
    expected = [
        reference(folder, queries, "query"),
        reference(folder, documents, "document", max_active_dims=max_active_dims),
        reference(folder, documents[:5]),
        reference(folder, queries[:5], "query", max_active_dims=max_active_dims),
    ]
    for (_, body), want in zip(answers, expected):
        assert mismatches([a["embedding"] for a in body], want) == 0


def test_a_router_of_splade_and_csr_routes_over_one_transformer_is_refused_in_one_line(csr_routers, tmp_path):
    """One transformer cannot run as a masked LM for a SPLADE route and as an encoder for a CSR route: refused with
    its own line (not as routes of different sizes)."""
    import json
    import shutil

    from bucketing.kinds.sparse.folder import read_sparse
    from bucketing.model.chain import ChainError

    folder = shutil.copytree(csr_routers["csr-shared-router"], tmp_path / "splade-and-csr")
    (folder / "query_9_SpladePooling").mkdir()
    (folder / "query_9_SpladePooling" / "config.json").write_text('{"pooling_strategy": "max"}')
    config = json.loads((folder / "router_config.json").read_text())
    config["types"]["query_9_SpladePooling"] = "sentence_transformers.sparse_encoder.modules.SpladePooling"
    config["structure"]["query"] = ["query_0_Transformer", "query_9_SpladePooling"]
    (folder / "router_config.json").write_text(json.dumps(config))
    (folder / "query_0_Transformer" / "sentence_bert_config.json").write_text('{"transformer_task": "fill-mask"}')
    with pytest.raises(ChainError, match="both SPLADE and CSR routes is not served") as refused:
        read_sparse(folder)
    assert "\n" not in str(refused.value)


def test_a_router_whose_static_weights_are_unreadable_is_refused_in_one_line(tmp_path):
    """A CSR Router's static route whose model.safetensors is not one: read_sparse (build and worker start) says so
    in one ChainError line, not a safetensors traceback."""
    from bucketing.kinds.sparse.folder import read_sparse
    from bucketing.model.chain import ChainError

    folder = build_csr_router(tmp_path / "unreadable")
    (weights,) = [p for p in folder.rglob("model.safetensors") if "SparseStaticEmbedding" in str(p)]
    weights.write_bytes(b"garbage")
    with pytest.raises(ChainError, match="not a safetensors file") as refused:
        read_sparse(folder)
    assert "\n" not in str(refused.value)


def test_two_csr_routes_sharing_one_autoencoder_keep_their_own_pooling(tmp_path):
    """A Router whose query and document routes share the Transformer and the SparseAutoEncoder instance (each saved
    once) but pool differently (cls, mean): each route answers with its own pooling, as encode_query/_document."""
    import torch
    from sentence_transformers.base.modules import Router, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from sentence_transformers.sparse_encoder.modules import SparseAutoEncoder

    from tests.models import build_tiny

    torch.manual_seed(13)
    transformer = Transformer(str(build_tiny(tmp_path / "body", "bert")))
    width = transformer.get_embedding_dimension()
    sae = SparseAutoEncoder(input_dim=width, hidden_dim=96, k=8)
    with torch.no_grad():
        sae.pre_bias.normal_(0, 0.1)
        sae.latent_bias.normal_(0, 0.1)
    queries = [transformer, Pooling(width, pooling_mode="cls"), sae]
    documents = [transformer, Pooling(width, pooling_mode="mean"), sae]
    folder = tmp_path / "shared-autoencoder"
    router = Router.for_query_document(queries, documents)
    sentence_transformers.SparseEncoder(modules=[router], device="cpu").save(str(folder))
    handler, context = make_handler(folder, task="sparse", max_length=64)
    texts = ["apple cherry alpha beta", "word " * 20, "a b c"]
    rows = [{"texts": texts, "input_type": "query"}, {"texts": texts, "input_type": "document"}]
    (s1, queried), (s2, documented) = serve_at(handler, context, rows, ["", ""])
    assert (s1, s2) == (200, 200)
    assert mismatches([a["embedding"] for a in documented], reference(folder, texts, "document")) == 0
    assert mismatches([a["embedding"] for a in queried], reference(folder, texts, "query")) == 0
