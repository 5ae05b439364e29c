"""Late chunking (`"chunking": "late"`): one pass over a text, one vector per character span, equal within 1e-5 to
sentence-transformers' `encode(output_value="token_embeddings")` mean-pooled over the tokens each span holds (then
normalised as the model normalises), on both engines and every strategy, mixed in one batch with ordinary texts;
and its refusals, each one line."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bucketing.chunks import sentences
from model_store.archives import engine_model_dir
from tests.handler.test_handler import make_handler, serve
from tests.models import build_sentence_transformer

np = pytest.importorskip("numpy")
sentence_transformers = pytest.importorskip("sentence_transformers")

TOLERANCE = 1e-5
MAX_LENGTH = 48
TEXT = (
    "Alpha beta gamma delta. Epsilon zeta eta theta iota kappa! Lambda mu?\nNu xi omicron pi rho sigma tau "
    "upsilon phi chi psi omega. " * 2
).strip()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("late")
    return {
        "mean-normalize": build_sentence_transformer(root / "mn", pooling="mean", normalize=True),
        "prompted": build_sentence_transformer(
            root / "pr", pooling="mean", prompts={"query": "query: "}, default_prompt="query", include_prompt=False
        ),
        "roberta": build_sentence_transformer(root / "ro", arch="roberta", pooling="mean", normalize=True),
        "cls": build_sentence_transformer(root / "cls", pooling="cls"),
    }


def reference(folder, text: str, spans, prompt: str = "") -> Any:
    """encode()'s token embeddings mean-pooled over each span's tokens (offsets inside the span), then the modules
    after Pooling (Normalize)."""
    import torch

    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    model.max_seq_length = MAX_LENGTH
    tokens = model.encode(text, output_value="token_embeddings", prompt=prompt, convert_to_tensor=True)
    enc = model.tokenizer(
        prompt + text,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
        truncation=True,
        max_length=MAX_LENGTH,
    )
    assert len(enc["input_ids"]) == tokens.shape[0]
    placed = located(model.tokenizer, prompt + text, enc["input_ids"], enc["special_tokens_mask"])
    out = []
    for start, end in spans:
        picked = [
            k
            for k, (a, b) in placed.items()
            if a >= len(prompt) and start <= a - len(prompt) and b - len(prompt) <= end
        ]
        features = {"sentence_embedding": tokens[picked].mean(dim=0)[None]}
        with torch.no_grad():
            for module in list(model)[2:]:
                features = module(features)
        out.append(features["sentence_embedding"][0].numpy())
    return np.array(out)


def located(tokenizer, text: str, ids, special) -> dict[int, tuple[int, int]]:
    """Where each token's own text lies in `text`, found by its string (not by the tokenizer's offsets, which the
    handler reads): each non-special token's text, its marks of a leading space or a word piece dropped, searched
    from where the one before ended (case folded). Tokens of white space alone are in no span."""
    placed, cursor, folded = {}, 0, text.lower()  # an uncased tokenizer's tokens are lower case
    for k, (i, is_special) in enumerate(zip(ids, special)):
        if is_special:
            continue
        piece = tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(i)])
        own = piece.replace("\u0120", " ").replace("\u010a", "\n").strip().removeprefix("##")  # byte-level's marks
        if not own:
            continue
        at = folded.index(own.lower(), cursor)
        assert not text[cursor:at].strip(), (own, text[cursor:at])  # nothing but white space skipped
        placed[k] = (at, at + len(own))
        cursor = at + len(own)
    return placed


def close(got, expected):
    diff = float(np.max(np.abs(np.asarray(got) - expected)))
    assert diff <= TOLERANCE, diff


def handler_for(folder, engine, tmp_path, **section):
    model_dir = engine_model_dir(folder, engine, "embedding", tmp_path / f"{engine}-{folder.name}")
    return make_handler(model_dir, engine=engine, max_length=MAX_LENGTH, **section)


@pytest.mark.parametrize(
    ("engine", "variant"),
    [
        *((e, v) for e in ("torch", "onnxruntime") for v in ("mean-normalize", "prompted", "roberta")),
        ("openvino", "mean-normalize"),
    ],
)
def test_spans_equal_sentence_transformers_token_embeddings_pooled(folders, variant, engine, tmp_path):
    folder = folders[variant]
    handler, context = handler_for(folder, engine, tmp_path)
    spans = [[0, 23], [24, 36], [0, 36], [6, 16]]
    rows = [
        {"body": {"texts": ["an ordinary text", "another one that is a little longer"]}},
        {"body": {"texts": [TEXT], "chunking": "late", "spans": spans}},
        {"body": {"texts": [TEXT, "One. Two!"], "chunking": "late", "spans": "sentences"}},
    ]
    (s1, plain), (s2, given), (s3, by_sentence) = serve(handler, context, rows)
    assert (s1, s2, s3) == (200, 200, 200)
    prompt = "query: " if variant == "prompted" else ""
    (answer,) = given
    assert [c["span"] for c in answer["chunks"]] == spans and answer["truncated"] is True
    close([c["embedding"] for c in answer["chunks"]], reference(folder, TEXT, spans, prompt))
    for text, answer in zip([TEXT, "One. Two!"], by_sentence):
        read = [s for s in sentences(text) if s[1] <= len(text)]
        got = [c for c in answer["chunks"]]
        assert [tuple(c["span"]) for c in got] == read[: len(got)]
    close([c["embedding"] for c in by_sentence[1]["chunks"]], reference(folder, "One. Two!", [[0, 4], [5, 9]], prompt))
    assert all("embedding" in a for a in plain)


@pytest.mark.parametrize("strategy", ["dynamic", "static"])
def test_late_answers_do_not_depend_on_strategy_or_batch(folders, strategy, tmp_path):
    folder = folders["mean-normalize"]
    handler, context = handler_for(folder, "torch", tmp_path, strategy=strategy)
    body = {"texts": ["One two. Three four five!", "Six."], "chunking": "late", "spans": "sentences"}
    alone = serve(handler, context, [{"body": body}])[0][1]
    mixed = serve(handler, context, [{"body": {"text": "x " * 30}}, {"body": body}])[1][1]
    for a, b in zip(alone, mixed):
        close([c["embedding"] for c in a["chunks"]], np.array([c["embedding"] for c in b["chunks"]]))
    context.with_requests(["application/json"], ["v1/embeddings"])
    (openai,) = handler.handle([{"body": {"input": body["texts"], "chunking": "late", "spans": "sentences"}}], context)
    data = json.loads(openai)["data"]
    assert [(d["index"], d["input"], d["span"]) for d in data] == [
        (k, i, c["span"]) for k, (i, c) in enumerate((i, c) for i, a in enumerate(alone) for c in a["chunks"])
    ]
    close([d["embedding"] for d in data], np.array([c["embedding"] for a in alone for c in a["chunks"]]))
    v1 = {"instances": body["texts"], "parameters": {"chunking": "late", "spans": "sentences"}}
    ((status, kserve),) = serve(handler, context, [{"body": v1}])
    assert status == 200 and [p["chunks"] for p in kserve["predictions"]] == [a["chunks"] for a in alone]


def test_refusals_are_one_line_each(folders, tmp_path):
    handler, context = handler_for(folders["mean-normalize"], "torch", tmp_path)
    late = {"chunking": "late"}
    rows = [
        {"body": {"texts": ["a b", "c d"], **late, "spans": [[0, 1]]}},
        {"body": {"texts": ["hello world"], **late, "spans": [[0, 3]]}},
        {"body": {"texts": ["hello world"], **late, "spans": [[0, 30]]}},
        {"body": {"texts": [TEXT * 3], **late, "spans": [[0, 5], [len(TEXT) * 2, len(TEXT) * 2 + 5]]}},
        {"body": {"texts": ["a"], **late, "spans": [[2, 1]]}},
        {"body": {"texts": ["a"], "spans": [[0, 1]]}},
        {"body": {"texts": ["a"], **late, "on_overflow": "chunk"}},
    ]
    got = serve(handler, context, rows)
    expected = [
        (400, 'are one text\'s; this request has 2 texts: send one text per request, or "spans": "sentences"'),
        (400, "spans[0] = [0, 3] of texts[0] holds no whole token"),
        (400, "spans[0] = [0, 30] ends past its 11 characters"),
        (413, "holds no whole token among the first max_length=48 tokens late chunking reads"),
        (400, '"spans" must be "sentences" or a list of 1 to 48 [start, end] character offsets'),
        (400, '"spans" is for late chunking: send it with "chunking": "late"'),
        (400, 'send "chunking": "late" or "on_overflow": "chunk", not both'),
    ]
    for (status, body), (want, line) in zip(got, expected):
        assert status == want and line in body["message"] and "\n" not in body["message"], body
    context.with_requests(["application/json"], ["v1/embeddings"])
    (body,) = handler.handle([{"body": {"input": "a", **late, "spans": "sentences"}}], context)
    assert context.status[0][0] == 200, body
    context.with_requests(["application/json"], ["embed"])  # TEI's
    (body,) = handler.handle([{"body": {"inputs": "a", **late, "spans": "sentences"}}], context)
    assert "is not served by TEI's API" in json.loads(body)["error"]

    cls, context = handler_for(folders["cls"], "torch", tmp_path)
    ((status, body),) = serve(cls, context, [{"body": {"texts": ["a"], **late, "spans": "sentences"}}])
    assert status == 400 and "served for models that mean-pool with no Dense layer after it" in body["message"]


@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
def test_a_sentence_keeps_its_first_word_where_offsets_hold_the_space_before_it(folders, engine, tmp_path):
    """A byte-level BPE under a TemplateProcessing post-processor (how the ModernBERT family ships, and this test
    tokenizer) gives `Ġserv` the offsets 15-20, the space before it included: the second sentence [16, 44] held no
    `serv` (ModernBERT's `ĠGamma` likewise: its vector was 0.130 from the sentence's mean), and a span around the word
    itself was a 400 "holds no whole token"."""
    text = "long documents. serving transformer queries."
    handler, context = handler_for(folders["roberta"], engine, tmp_path)
    rows = [
        {"body": {"texts": [text], "chunking": "late", "spans": "sentences"}},
        {"body": {"texts": [text], "chunking": "late", "spans": [[16, 23]]}},
    ]
    (s1, (by_sentence,)), (s2, (word,)) = serve(handler, context, rows)
    assert (s1, s2) == (200, 200), (by_sentence, word)
    assert [c["span"] for c in by_sentence["chunks"]] == [[0, 15], [16, 44]]
    close([c["embedding"] for c in by_sentence["chunks"]], reference(folders["roberta"], text, [[0, 15], [16, 44]]))
    close([word["chunks"][0]["embedding"]], reference(folders["roberta"], text, [[16, 23]]))
