"""Any Hugging Face encoder in one build command: tiny random BERT, RoBERTa and DistilBERT models, built with
`python -m model_store.build --model-dir ... --name ...` and served by a real TorchServe, answer like batch-of-one
in process; a folder the handler cannot serve gets a one-line error."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bucketing_handler import BucketingHandler
from model_store import archives, build
from tests.e2e.conftest import call_all
from tests.e2e.test_serving import texts_for_load
from tests.models import build_tiny
from tsctl.inprocess import LocalContext

pytestmark = pytest.mark.e2e
CASES = [
    ("bert", "embedding", "torch"),
    ("roberta", "embedding", "onnxruntime"),
    ("distilbert", "classification", "torch"),
]


def in_process(model_dir, task):
    """Batch-of-one answers in process, with the max_length the build wrote (where sentence-transformers cuts)."""
    max_length = archives.check_model_dir(model_dir, task)
    context = LocalContext(
        {
            "model_path": str(model_dir),
            "task": task,
            "max_length": max_length,
            "cost": {"calibrate": False},
            "strategy": "dynamic",
        }
    )
    handler = BucketingHandler()
    handler.initialize(context)

    def one(text):
        context.with_requests(["application/json"])
        return json.loads(handler.handle([{"body": {"text": text}}], context)[0])

    return one


def build_and_register(torchserve, model_store, folder, name, task="embedding", engine=None):
    """One command builds the folder's bucketed archive; it is registered with batching on (1 worker)."""
    argv = [
        "--model-dir",
        str(folder),
        "--name",
        name,
        "--task",
        task,
        "--strategies",
        "bucketed",
        "--out",
        str(model_store),
        *(["--engine", engine] if engine else []),
    ]
    assert build.main(argv) == 0
    torchserve.client.register(f"{name}-bucketed.mar", name, batch_size=8, max_batch_delay=50, workers=1)
    return torchserve.client


@pytest.mark.parametrize("arch, task, engine", CASES)
def test_a_users_encoder_builds_and_serves(torchserve, model_store, tmp_path, arch, task, engine):
    folder = build_tiny(tmp_path / arch, arch, classifier=task == "classification")
    name = f"tiny-{arch}"
    client = build_and_register(torchserve, model_store, folder, name, task, engine)
    try:
        texts = texts_for_load(12, seed=3)
        with ThreadPoolExecutor(len(texts)) as pool:
            replies = list(pool.map(lambda t: client.predict(name, json.dumps({"text": t})), texts))
        reference = in_process(folder, task)
        for text, reply in zip(texts, replies, strict=True):
            assert reply.status == 200, reply.text[:300]
            got, ref = reply.json(), reference(text)
            if task == "embedding":
                assert np.max(np.abs(np.array(got["embedding"]) - np.array(ref["embedding"]))) <= 1e-5
            else:
                assert got["label"] == ref["label"]
                assert max(abs(got["scores"][k] - ref["scores"][k]) for k in got["scores"]) <= 1e-5
    finally:
        client.unregister(name)


def unknown_architecture(folder):
    (folder / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    return folder


def no_tokenizer(folder):
    build_tiny(folder, "bert")
    for name in ("tokenizer.json", "vocab.txt"):
        (folder / name).unlink()
    return folder


@pytest.mark.parametrize(
    "make, words",
    [(lambda d: d, "no config.json"), (unknown_architecture, "config.json is"), (no_tokenizer, "tokenizer")],
)
def test_a_folder_it_cannot_serve_gets_one_line(tmp_path, capsys, make, words):
    folder = tmp_path / "model"
    folder.mkdir()
    folder = make(folder)
    capsys.readouterr()  # what building the folder printed
    assert build.main(["--model-dir", str(folder), "--name", "x", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and words in err and "\n" not in err


@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
def test_a_sentence_transformers_folder_serves_exactly_what_it_encodes(torchserve, model_store, tmp_path, engine):
    """A bge-style chain (CLS pooling, a Dense, Normalize, a query prompt) saved by sentence-transformers, built
    with one command and served by a real TorchServe: every answer equals SentenceTransformer.encode()."""
    from sentence_transformers import SentenceTransformer

    from tests.models import build_sentence_transformer

    folder = build_sentence_transformer(
        tmp_path / "bge",
        pooling="cls",
        dense=((16, True, "Tanh"),),
        normalize=True,
        prompts={"query": "Represent this sentence for searching: "},
    )
    name = f"tiny-st-{engine}"
    client = build_and_register(torchserve, model_store, folder, name, engine=engine)
    try:
        texts = texts_for_load(10, seed=4)
        bodies = [{"text": t} if i % 2 else {"text": t, "prompt_name": "query"} for i, t in enumerate(texts)]
        with ThreadPoolExecutor(len(texts)) as pool:
            replies = list(pool.map(lambda b: client.predict(name, json.dumps(b)), bodies))
        model = SentenceTransformer(str(folder), device="cpu")
        for i, (text, reply) in enumerate(zip(texts, replies, strict=True)):
            assert reply.status == 200, reply.text[:300]
            expected = model.encode([text], prompt_name=None if i % 2 else "query")[0]
            assert np.max(np.abs(np.array(reply.json()["embedding"]) - expected)) <= 1e-5
    finally:
        client.unregister(name)


def test_a_cross_encoder_serves_every_pair_format_as_cross_encoder_scores(torchserve, model_store, tmp_path):
    """A tiny CrossEncoder (BERT, one label) through a real TorchServe: our JSON pairs, TEI's /rerank, the
    Cohere-style /v1/rerank and KServe v2's two inputs, sent at once so they share batches."""
    from sentence_transformers import CrossEncoder

    from tests.handler.test_cross_encoder import ranked_as_expected
    from tests.models import build_cross_encoder

    folder = build_cross_encoder(tmp_path / "ce", "bert", labels=1)
    name = "tiny-ce"
    client = build_and_register(torchserve, model_store, folder, name, "classification")
    query, docs = "how is a model served", texts_for_load(6, seed=5)
    v2 = {
        "inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [len(docs)], "data": [query] * len(docs)},
            {"name": "text_pair", "datatype": "BYTES", "shape": [len(docs)], "data": docs},
        ]
    }
    calls = [
        (f"/predictions/{name}", {"pairs": [[query, d] for d in docs]}),
        (f"/predictions/{name}/1.0/rerank", {"query": query, "texts": docs}),
        (f"/predictions/{name}/1.0/v1/rerank", {"query": query, "documents": docs, "top_n": 3}),
        (f"/v2/models/{name}/infer", v2),
    ]
    try:
        replies = call_all(client, calls)
        for reply in replies:
            assert reply.status == 200, reply.body[:300]
        expected = CrossEncoder(str(folder), device="cpu").predict([(query, d) for d in docs])
        pairs, tei, cohere, kserve = (r.json() for r in replies)
        assert np.max(np.abs(np.array([a["score"] for a in pairs]) - expected)) <= 1e-5
        ranked_as_expected(tei, expected, "score", len(docs))
        ranked_as_expected(cohere["results"], expected, "relevance_score", 3)
        scores = next(o for o in kserve["outputs"] if o["name"] == "score")
        assert scores["shape"] == [len(docs)] and np.max(np.abs(np.array(scores["data"]) - expected)) <= 1e-5
    finally:
        client.unregister(name)


def test_a_multi_vector_folder_is_detected_and_serves_what_it_encodes(torchserve, model_store, tmp_path):
    """A ColBERT-style folder saved by MultiVectorEncoder (prefixes, a punctuation skiplist, fixed query expansion,
    a Dense, Normalize), built with one command that detects it (no --task) and served by a real TorchServe: our
    JSON with input_type and TEI's /embed_all, sent at once so they share batches, equal encode_query(),
    encode_document() and encode() within 1e-5, token by token."""
    import string

    from sentence_transformers import MultiVectorEncoder

    from tests.models import build_multi_vector_encoder

    folder = build_multi_vector_encoder(
        tmp_path / "colbert",
        dense=((12, False, "Identity"),),
        skiplist=tuple(string.punctuation),
        prompts={"query": "[unused0] ", "document": "[unused1] "},
        query_length=16,
        document_length=40,
        expansion={"strategy": "fixed", "attend": False, "length": 16},
    )
    name = "tiny-colbert"
    argv = ["--model-dir", str(folder), "--name", name, "--strategies", "bucketed", "--out", str(model_store)]
    assert build.main(argv) == 0
    torchserve.client.register(f"{name}-bucketed.mar", name, batch_size=8, max_batch_delay=50, workers=1)
    client = torchserve.client
    texts = [t + ", with punctuation!" for t in texts_for_load(6, seed=6)]
    calls = [
        (f"/predictions/{name}", {"texts": texts, "input_type": "query"}),
        (f"/predictions/{name}", {"texts": texts, "input_type": "document"}),
        (f"/predictions/{name}/1.0/embed_all", {"inputs": texts}),
        (f"/predictions/{name}/1.0/v1/embeddings", {"input": texts, "model": name}),
    ]
    try:
        replies = call_all(client, calls)
        model = MultiVectorEncoder(str(folder), device="cpu")
        expected = [
            model.encode_query(texts, convert_to_numpy=True),
            model.encode_document(texts, convert_to_numpy=True),
            model.encode(texts, convert_to_numpy=True),
        ]
        got = [[a["embeddings"] for a in replies[0].json()], [a["embeddings"] for a in replies[1].json()]]
        got.append(replies[2].json())
        for reply in replies[:3]:
            assert reply.status == 200, reply.body[:300]
        for side, want in zip(got, expected, strict=True):
            for g, e in zip(side, want, strict=True):
                assert np.asarray(g).shape == e.shape and np.max(np.abs(np.asarray(g) - e)) <= 1e-5
        assert replies[3].status == 400 and "embed_all" in replies[3].body.decode()
    finally:
        client.unregister(name)
