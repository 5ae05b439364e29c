"""Text Embeddings Inference's routes through the handler in process, on tiny random models saved by
sentence-transformers itself: /embed and the plain path equal `SentenceTransformer.encode()`, /predict equals
`CrossEncoder.predict()` (within 1e-5), /tokenize and /decode equal the model's own tokenizer, /info tells the
handler's settings, and TEI's errors come in its shape and codes."""

from __future__ import annotations

import json

import pytest

from tests.handler.test_handler import make_handler, mixed_texts, serve_at
from tests.models import build_cross_encoder, build_sentence_transformer
from tsctl.inprocess import torchserve_body

np = pytest.importorskip("numpy")
sentence_transformers = pytest.importorskip("sentence_transformers")

TOLERANCE = 1e-5
MAX_LENGTH = 64
PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    folder = build_sentence_transformer(tmp_path_factory.mktemp("tei") / "st", prompts=PROMPTS, max_seq_length=64)
    handler, context = make_handler(folder, max_length=MAX_LENGTH, max_texts_per_request=8)
    return folder, handler, context


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    folder = build_cross_encoder(tmp_path_factory.mktemp("tei") / "ce", labels=3)
    handler, context = make_handler(folder, task="classification", max_length=MAX_LENGTH)
    return folder, handler, context


def close(got, expected):
    got = np.asarray(got)
    assert got.shape == expected.shape
    assert float(np.max(np.abs(got - expected))) <= TOLERANCE


def test_embed_and_the_plain_path_equal_sentence_transformers(embedder):
    folder, handler, context = embedder
    texts = mixed_texts(7, seed=21) + ["short"]
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    rows = [
        {"inputs": texts[:4]},
        {"inputs": texts[4:], "prompt_name": "passage"},
        {"inputs": texts[0]},
        {"inputs": texts[:3], "normalize": True, "dimensions": 8},
    ]
    (s1, a), (s2, b), (s3, c), (s4, d) = serve_at(handler, context, rows, ["embed", "", "embed", ""])
    assert [s1, s2, s3, s4] == [200] * 4
    close(a, model.encode(texts[:4], convert_to_numpy=True))
    close(b, model.encode(texts[4:], prompt_name="passage", convert_to_numpy=True))
    close(c, model.encode([texts[0]], convert_to_numpy=True))  # a string answers a list of one list
    cut = model.encode(texts[:3], convert_to_numpy=True, truncate_dim=8)
    close(d, cut / np.linalg.norm(cut, axis=1, keepdims=True))


def test_similarity_equals_sentence_transformers_cosine(embedder):
    folder, handler, context = embedder
    source, sentences = "how are encoders served", mixed_texts(5, seed=23)
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    expected = model.similarity(model.encode([source]), model.encode(sentences)).numpy()[0]
    body = {"inputs": {"source_sentence": source, "sentences": sentences}, "parameters": {}}
    (s1, at_route), (s2, at_plain) = serve_at(handler, context, [body, body], ["similarity", ""])
    assert s1 == s2 == 200
    close(at_route, expected)
    close(at_plain, expected)


def test_predict_equals_cross_encoder_best_first(classifier):
    folder, handler, context = classifier
    query, docs = "how are encoders served", mixed_texts(3, seed=22)
    model = sentence_transformers.CrossEncoder(str(folder), device="cpu", max_length=MAX_LENGTH)
    expected = model.predict([(query, d) for d in docs])
    classify = {"inputs": docs[1], "parameters": {"top_k": 2}}  # what InferenceClient.text_classification posts
    rows = [{"inputs": [[query, d] for d in docs]}, {"inputs": [query, docs[0]]}, classify]
    (s1, batch), (s2, one), (s3, text) = serve_at(handler, context, rows, ["predict", "predict", ""])
    assert [s1, s2, s3] == [200] * 3
    for ranked, scores in zip([*batch, one, text], [*expected, expected[0], None]):
        assert [p["score"] for p in ranked] == sorted((p["score"] for p in ranked), reverse=True)
        assert sorted(p["label"] for p in ranked) == ["LABEL_0", "LABEL_1", "LABEL_2"]
        if scores is not None:  # a pair: CrossEncoder's scores by label
            close([p["score"] for p in sorted(ranked, key=lambda p: p["label"])], np.asarray(scores))
    from huggingface_hub.inference._generated.types import TextClassificationOutputElement

    top = TextClassificationOutputElement.parse_obj_as_list(text)[0]  # how the client reads it: TEI's top label
    assert (top.label, top.score) == (text[0]["label"], text[0]["score"])


def test_tokenize_and_decode_equal_the_tokenizer(embedder):
    from transformers import AutoTokenizer

    folder, handler, context = embedder
    hf = AutoTokenizer.from_pretrained(str(folder))
    text = "Serving caf\u00e9 encoders, quickly!"
    rows = [{"inputs": text}, {"inputs": [text], "add_special_tokens": False, "prompt_name": "query"}]
    (s1, (tokens,)), (s2, (bare,)) = serve_at(handler, context, rows, ["tokenize", "tokenize"])
    assert s1 == s2 == 200
    encoded = hf(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    assert [t["id"] for t in tokens] == encoded["input_ids"]
    assert [t["special"] for t in tokens] == [bool(m) for m in encoded["special_tokens_mask"]]
    for t, (start, stop) in zip(tokens, encoded["offset_mapping"]):
        if not t["special"]:
            assert t["text"] == text[start:stop]
            assert text.encode()[t["start"] : t["stop"]].decode() == text[start:stop]  # UTF-8 byte offsets
    assert [t["id"] for t in bare] == hf("query: " + text, add_special_tokens=False)["input_ids"]
    ids = encoded["input_ids"]
    rows = [{"ids": ids}, {"ids": [ids, ids[:3]], "skip_special_tokens": False}]
    (s1, decoded), (s2, kept) = serve_at(handler, context, rows, ["decode", "decode"])
    assert decoded == [hf.decode(ids, skip_special_tokens=True)]
    assert kept == [hf.decode(ids, skip_special_tokens=False), hf.decode(ids[:3], skip_special_tokens=False)]


def test_info_tells_the_handlers_settings(embedder, classifier):
    _, handler, context = embedder
    ((status, info),) = serve_at(handler, context, [None], ["info"])
    assert status == 200 and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert (info["model_id"], info["max_input_length"], info["max_client_batch_size"]) == ("tiny", MAX_LENGTH, 8)
    _, handler, context = classifier
    ((status, info),) = serve_at(handler, context, [None], ["info"])
    assert info["model_type"]["classifier"]["id2label"] == {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}


def test_teis_errors_in_its_shape_and_codes(embedder, classifier):
    _, handler, context = embedder
    long_text = " ".join(["word"] * 200)
    rows = [
        {"inputs": long_text, "truncate": False},
        {"inputs": long_text, "truncate": True},
        {"inputs": ["a"] * 9},
        {"inputs": []},
        {"inputs": "a"},
        {"inputs": "a"},
    ]
    replies = serve_at(handler, context, rows, ["embed", "embed", "embed", "embed", "embed_sparse", "embed_all"])
    assert [s for s, _ in replies] == [422, 200, 422, 400, 424, 424]
    assert [b["error_type"] for s, b in replies if s != 200] == [
        "Validation",
        "Validation",
        "Empty",
        "Backend",
        "Backend",
    ]
    assert "more than max_length=64 tokens" in replies[0][1]["error"]
    _, handler, context = classifier
    ((status, body),) = serve_at(handler, context, [{"inputs": "a"}], ["embed"])
    assert status == 424 and body["error"].startswith("Model is not an embedding model")


def test_bodies_are_decoded_once_as_torchserve_hands_them_over(embedder):
    """A JSON string is never a second envelope (a 400 at our path, TEI's 422 at /embed); an envelope sent as
    application/octet-stream is read as JSON (as without a Content-Type), never embedded as a text."""
    folder, handler, context = embedder
    sent = [
        (b'"{\\"text\\": \\"hello\\"}"', "application/json", ""),
        (b'"hello"', "application/json; charset=utf-8", ""),
        (b'"hello"', "application/json", "embed"),
        (b'{"text": "hello"}', "application/octet-stream", ""),
        (b'{"inputs": "hello"}', "application/octet-stream", "embed"),
        (b"hello", "application/octet-stream", ""),
    ]
    delivered = [torchserve_body(raw, content_type) for raw, content_type, _ in sent]
    context.with_requests([media for _, media in delivered], [path for _, _, path in sent])
    replies = [json.loads(b) for b in handler.handle([{"body": body} for body, _ in delivered], context)]
    statuses = [context.status[i][0] for i in range(len(sent))]
    assert statuses == [400, 400, 422, 200, 200, 200], replies
    assert all("got a JSON string" in json.dumps(r) for r in replies[:3])
    expected = sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(["hello"])
    close([replies[3]["embedding"]], expected)
    close(replies[4], expected)
    close([replies[5]["embedding"]], expected)
