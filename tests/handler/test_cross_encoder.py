"""Cross-encoders answer as sentence-transformers' CrossEncoder: `predict(pairs)` scores and `rank()` order, through
our JSON pairs, TEI's /rerank and the Cohere-style /v1/rerank, on every engine, pairs over max_length included."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from model_store.archives import engine_model_dir
from tests.handler.test_handler import make_handler, mixed_texts, serve
from tests.models import build_cross_encoder

np = pytest.importorskip("numpy")
sentence_transformers = pytest.importorskip("sentence_transformers")

TOLERANCE = 1e-5
MAX_LENGTH = 48  # short, so the long documents below are cut (longest_first)
QUERY = "how are transformer encoders served"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ce")
    return {
        (arch, labels): build_cross_encoder(root / f"{arch}-{labels}", arch, labels)
        for arch in ("bert", "roberta")
        for labels in (1, 3)
    }


def documents(n=9, seed=11):
    return mixed_texts(n, seed=seed)


def handler_for(folder, engine, tmp_path, **section):
    model_dir = engine_model_dir(folder, engine, "classification", tmp_path / f"{engine}-{folder.name}")
    return make_handler(model_dir, task="classification", engine=engine, max_length=MAX_LENGTH, **section)


def ranked_as_expected(results, expected, key, top_n):
    """Best first, each score the reference's (within 1e-5), and the top `top_n` the reference's top (scores of a
    random tiny model tie within float noise, so equal scores may come in either order)."""
    scores = [r[key] for r in results]
    assert len(results) == top_n and scores == sorted(scores, reverse=True)
    assert max(abs(r[key] - expected[r["index"]]) for r in results) <= 1e-5
    left_out = [expected[i] for i in range(len(expected)) if i not in {r["index"] for r in results}]
    assert all(min(scores) >= s - 1e-5 for s in left_out)


def serve_at(handler, context, rows, paths):
    """Rows sent to their url_paths (what follows /predictions/NAME/VERSION/; "" the plain path)."""
    import json

    context.with_requests(["application/json"] * len(rows), [p or "" for p in paths])
    bodies = handler.handle(rows, context)
    return [(context.status[i][0], json.loads(b)) for i, b in enumerate(bodies)]


def cross_encoder(folder):
    return sentence_transformers.CrossEncoder(str(folder), device="cpu", max_length=MAX_LENGTH)


@pytest.mark.parametrize("engine", ["torch", "onnxruntime", "openvino"])
@pytest.mark.parametrize(("arch", "labels"), [("bert", 1), ("bert", 3), ("roberta", 1), ("roberta", 3)])
def test_pairs_score_as_cross_encoder_predicts(models, arch, labels, engine, tmp_path):
    folder = models[arch, labels]
    docs = documents()
    pairs = [[QUERY, d] for d in docs] + [[d, QUERY] for d in docs[:3]]
    expected = np.atleast_2d(cross_encoder(folder).predict(pairs)).reshape(len(pairs), labels)
    handler, context = handler_for(folder, engine, tmp_path)
    half = len(pairs) // 2  # two requests in one batch, planned together
    answers = serve(handler, context, [{"body": {"pairs": pairs[:half]}}, {"body": {"pairs": pairs[half:]}}])
    assert [s for s, _ in answers] == [200, 200]
    got = [a for _, body in answers for a in body]
    values = np.array([[a["score"]] if labels == 1 else list(a["scores"].values()) for a in got])
    assert float(np.max(np.abs(values - expected))) <= TOLERANCE
    assert any(a["truncated"] for a in got) and not all(a["truncated"] for a in got)


@pytest.mark.parametrize("engine", ["torch", "openvino"])
@pytest.mark.parametrize(("arch", "labels"), [("bert", 1), ("roberta", 3)])
def test_pairs_in_bfloat16_score_near_cross_encoder_and_keep_the_rerank_order(
    models, arch, labels, engine, tmp_path, bf16_cpu, request
):
    """bfloat16 (on a CPU that multiplies it natively; on openvino, where OpenVINO runs it): pairs score within the
    error the worker measured at start (its max abs score diff, with a margin), and /rerank orders as
    CrossEncoder.rank except near ties."""
    if engine == "openvino":
        request.getfixturevalue("openvino_bf16")
    folder = models[arch, labels]
    if labels == 1:  # a reranker's gate compares its scores across texts: spread them (a tiny random one's are flat)
        folder = sharpened(Path(shutil.copytree(folder, tmp_path / "sharpened")))
    docs = documents()
    pairs = [[QUERY, d] for d in docs]
    expected = np.atleast_2d(cross_encoder(folder).predict(pairs)).reshape(len(pairs), labels)
    handler, context = handler_for(folder, engine, tmp_path, dtype="bfloat16")
    fidelity = handler.task.engine.fidelity
    assert fidelity.dtype == "bfloat16" and fidelity.compared > 0 and fidelity.cosine_min >= 0.999
    ((status, got),) = serve(handler, context, [{"body": {"pairs": pairs}}])
    values = np.array([[a["score"]] if labels == 1 else list(a["scores"].values()) for a in got])
    error = float(np.max(np.abs(values - expected)))
    assert status == 200 and error <= max(4 * fidelity.max_abs_diff, 1e-3), (error, fidelity)
    if labels == 1:
        (tei,) = serve_at(handler, context, [{"body": {"query": QUERY, "texts": docs}}], ["rerank"])
        order = [r["index"] for r in tei[1]]
        reference = expected[:, 0]
        for above, below in zip(order, order[1:]):  # a swap only where float32 scores lie within the error
            assert reference[above] >= reference[below] - 2 * error


def test_one_pair_and_raw_scores(models, tmp_path):
    folder = models["bert", 1]
    handler, context = handler_for(folder, "torch", tmp_path)
    rows = [
        {"body": {"text": QUERY, "text_pair": "a passage"}},
        {"body": {"pairs": [[QUERY, "a passage"]], "raw_scores": True}},
    ]
    (status, one), (_, raw) = serve(handler, context, rows)
    model = cross_encoder(folder)
    assert status == 200 and abs(one["score"] - float(model.predict([(QUERY, "a passage")])[0])) <= TOLERANCE
    logit = float(model.predict([(QUERY, "a passage")], activation_fn=__import__("torch").nn.Identity())[0])
    assert abs(raw[0]["score"] - logit) <= TOLERANCE


@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
def test_rerank_routes_rank_as_cross_encoder_ranks(models, engine, tmp_path):
    folder = models["bert", 1]
    docs = documents(12, seed=12)
    ranked = cross_encoder(folder).rank(QUERY, docs, return_documents=True)
    handler, context = handler_for(folder, engine, tmp_path)
    tei, cohere = serve_at(
        handler,
        context,
        [
            {"body": {"query": QUERY, "texts": docs, "return_text": True}},
            {"body": {"model": "ce", "query": QUERY, "documents": docs, "top_n": 5, "return_documents": True}},
        ],
        ["rerank", "v1/rerank"],
    )
    assert tei[0] == 200 and cohere[0] == 200, (tei, cohere)
    expected = {r["corpus_id"]: r["score"] for r in ranked}
    ranked_as_expected(tei[1], [expected[i] for i in range(len(docs))], "score", len(docs))
    assert all(r["text"] == docs[r["index"]] for r in tei[1])
    results = cohere[1]["results"]
    ranked_as_expected(results, [expected[i] for i in range(len(docs))], "relevance_score", 5)
    assert all(r["document"] == {"text": docs[r["index"]]} for r in results) and cohere[1]["model"] == "ce"
    assert cohere[1]["usage"]["total_tokens"] > 0


def test_a_bad_document_is_its_requests_4xx_and_its_neighbours_are_answered(models, tmp_path):
    handler, context = handler_for(models["bert", 1], "torch", tmp_path)
    answers = serve_at(
        handler,
        context,
        [
            {"body": {"query": QUERY, "texts": ["fine", ""]}},
            {"body": {"query": QUERY, "documents": ["fine", 3]}},
            {"body": {"query": QUERY, "documents": ["a good one", "another"]}},
            {"body": {"pairs": [[QUERY, "ok"]]}},
        ],
        ["rerank", "v1/rerank", "v1/rerank", None],
    )
    assert [s for s, _ in answers] == [400, 400, 200, 200]
    assert answers[0][1] == {"error": "texts[1] is empty", "error_type": "EmptyText"}
    assert (
        answers[1][1]["error"]["param"] == "documents"
        and "documents[1] must be a string" in answers[1][1]["error"]["message"]
    )


def test_rerank_on_a_three_label_model_or_an_embedder_is_a_404_saying_why(models, tiny_embedder_dir, tmp_path):
    handler, context = handler_for(models["bert", 3], "torch", tmp_path)
    ((status, body),) = serve_at(handler, context, [{"body": {"query": QUERY, "documents": ["x"]}}], ["v1/rerank"])
    assert status == 404 and "one-label classification models" in body["error"]["message"]
    embedder, ctx = make_handler(tiny_embedder_dir)
    ((status, body),) = serve(embedder, ctx, [{"body": {"pairs": [["a", "b"]]}}])
    assert status == 400 and "text pairs need a classification model" in body["message"]


def test_prompts_go_before_the_query_as_cross_encoder_puts_them(models, tmp_path):
    """A CrossEncoder's own prompts (and its default one), a named one or a request's `prompt`: put before each
    pair's query, as `CrossEncoder.predict(pairs, prompt_name=..., prompt=...)` does, on every pair route; a plain
    cross-encoder takes a request's `prompt` the same way (never accepted and ignored)."""
    prompts = {"q": "query: ", "find": "Find the passage that answers: "}
    folder = sharpened(build_cross_encoder(tmp_path / "prompted", prompts=prompts, default_prompt="q"))
    docs = documents(4, seed=12)
    pairs = [[QUERY, d] for d in docs]
    model = cross_encoder(folder)
    handler, context = handler_for(folder, "torch", tmp_path)
    without = model.predict(pairs, prompt="")
    for options in ({}, {"prompt_name": "find"}, {"prompt": "custom: "}, {"prompt": ""}):
        expected = model.predict(pairs, **options)
        assert options == {"prompt": ""} or np.max(np.abs(expected - without)) > 100 * TOLERANCE  # not by chance
        v2 = {
            "inputs": [
                {"name": n, "datatype": "BYTES", "shape": [4], "data": list(c)}
                for n, c in zip(("text", "text_pair"), zip(*pairs))
            ]
        }
        rows = [
            {"body": {"pairs": pairs, **options}},
            {"body": {**v2, "parameters": options}},
            {"body": {"query": QUERY, "texts": docs, **options}},  # as CrossEncoder.rank(prompt_name=...) ranks
            {"body": {"query": QUERY, "documents": docs, **options}},
        ]
        answers = serve_at(handler, context, rows, ["", "", "rerank", "v1/rerank"])
        assert all(s == 200 for s, _ in answers), answers
        native, kserve, tei, cohere = (body for _, body in answers)
        assert max(abs(a["score"] - e) for a, e in zip(native, expected)) <= TOLERANCE, options
        assert max(abs(a - e) for a, e in zip(kserve["outputs"][0]["data"], expected)) <= TOLERANCE, options
        ranked_as_expected(tei, expected, "score", len(docs))
        ranked_as_expected(cohere["results"], expected, "relevance_score", len(docs))
    plain = sharpened(build_cross_encoder(tmp_path / "plain"))
    handler, context = handler_for(plain, "torch", tmp_path)
    ((status, body),) = serve(handler, context, [{"body": {"pairs": pairs, "prompt": "custom: "}}])
    expected = cross_encoder(plain).predict(pairs, prompt="custom: ")
    assert np.max(np.abs(expected - cross_encoder(plain).predict(pairs))) > 100 * TOLERANCE
    assert status == 200 and max(abs(a["score"] - e) for a, e in zip(body, expected)) <= TOLERANCE


def sharpened(folder):
    """The model with its weight matrices scaled up, so that a prompt moves its scores well past the tolerance (a
    tiny random model's scores differ by about 1e-5 whatever its input)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    with torch.no_grad():
        for weight in (p for p in model.parameters() if p.dim() == 2):
            weight.mul_(10)
    model.save_pretrained(folder)
    return folder


def test_a_query_past_the_bounded_prefix_is_truncated_on_every_pair_route(models, tmp_path):
    """A prose query over max_cut_chars (128 x max_length characters) with a document over max_length tokens is
    cut longest_first as CrossEncoder cuts it (was a 413 under the default on_overflow: truncate)."""
    folder = models["bert", 1]
    handler, context = handler_for(folder, "torch", tmp_path)
    query = "how are transformer encoders served in production, and at what cost? " * 100
    doc = "a document about serving encoders, long enough to be cut. " * 12
    assert len(query) > handler.pipeline.tokenizer.max_cut_chars
    expected = float(cross_encoder(folder).predict([(query, doc)])[0])
    answers = serve_at(
        handler,
        context,
        [
            {"body": {"pairs": [[query, doc]]}},
            {"body": {"query": query, "texts": [doc]}},
            {"body": {"query": query, "documents": [doc]}},
        ],
        [None, "rerank", "v1/rerank"],
    )
    assert [s for s, _ in answers] == [200, 200, 200], answers
    (pair,), (tei,), cohere = (body for _, body in answers)
    scores = [pair["score"], tei["score"], cohere["results"][0]["relevance_score"]]
    assert pair["truncated"] and max(abs(s - expected) for s in scores) <= TOLERANCE


def test_the_build_reads_a_cross_encoders_own_prompts(tmp_path, capsys):
    """`--default-prompt` may name a prompt the CrossEncoder saved (was refused as unknown), and malformed prompts
    in its folder are the build's one line (was: the archive built, and its worker refused to start)."""
    import json

    from model_store import build

    folder = build_cross_encoder(tmp_path / "prompted", prompts={"query": "query: "})
    argv = ["--model-dir", str(folder), "--task", "classification", "--strategies", "bucketed", "--engine", "torch"]
    argv += ["--print-commands", "--stage-dir", str(tmp_path / "stage")]
    assert build.main([*argv, "--default-prompt", "query"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    settings = folder / "config_sentence_transformers.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "prompts": ["query: "]}))
    assert build.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and err.endswith("prompts must map names to texts") and "\n" not in err, err
