"""`on_overflow: chunk`: a text over max_length answered as the mean of its windows' pooled vectors weighted by their
text tokens, then normalised; equal within 1e-5 to the same computed with sentence-transformers' own modules on the
same windows, on both engines, every strategy and schedule, mixed in one batch with texts that fit; and its refusals,
each one line."""

from __future__ import annotations

import json
from typing import Any

import pytest

from model_store.archives import engine_model_dir
from tests.handler.test_continuous import continuous
from tests.handler.test_handler import make_handler, mixed_texts, serve
from tests.models import build_sentence_transformer
from tsctl.inprocess import ContinuousFrontend

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
sentence_transformers = pytest.importorskip("sentence_transformers")

TOLERANCE = 1e-5
MAX_LENGTH = 32
VARIANTS: dict[str, dict[str, Any]] = {
    "mean-normalize": {"pooling": "mean", "normalize": True},
    "cls": {"pooling": "cls"},
    "prompt-excluded": {
        "pooling": "mean",
        "prompts": {"query": "Represent this sentence for searching: "},
        "include_prompt": False,
        "normalize": True,
    },
    "roberta-lasttoken": {"arch": "roberta", "pooling": "lasttoken", "normalize": True},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("chunk")
    return {name: build_sentence_transformer(root / name, **spec) for name, spec in VARIANTS.items()}


def long_texts(n: int, seed: int) -> list[str]:
    """Texts of 1 to 300 words: most over MAX_LENGTH tokens, a few within it."""
    return [" ".join(t for _ in range(1 + k % 4) for t in [text]) for k, text in enumerate(mixed_texts(n, seed))]


def reference(
    folder, text: str, prompt: str = "", tokens: int = 0, overlap: int = 0, max_length: int = MAX_LENGTH
) -> Any:
    """sentence-transformers' own modules on the windows: its Transformer and Pooling per window, the pooled vectors
    averaged by their text tokens, then the modules after Pooling (Normalize)."""
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    tok = model.tokenizer
    ids = tok(prompt + text, add_special_tokens=False)["input_ids"]
    lead = len(tok(prompt, add_special_tokens=False)["input_ids"]) if prompt else 0
    bare, full = tok("hello", add_special_tokens=False)["input_ids"], tok("hello")["input_ids"]
    start = next(k for k in range(len(full)) if full[k : k + len(bare)] == bare)
    prefix, suffix = full[:start], full[start + len(bare) :]  # the special tokens the tokenizer wraps a text in
    room = max_length - len(prefix) - len(suffix) - lead
    window = min(tokens or room, room)
    body, starts = ids[lead:], [0]
    while starts[-1] + window < len(body):
        starts.append(starts[-1] + window - overlap)
    pooled, weights = [], []
    for s in starts:
        piece = body[s : s + window]
        row = torch.tensor([prefix + ids[:lead] + piece + suffix])
        features = {"input_ids": row, "attention_mask": torch.ones_like(row)}
        if "token_type_ids" in tok.model_input_names:
            features["token_type_ids"] = torch.zeros_like(row)
        if prompt:
            features["prompt_length"] = len(tok(prompt)["input_ids"]) - 1  # as sentence-transformers counts it
        with torch.no_grad():
            out = model[1](model[0](features))
        pooled.append(out["sentence_embedding"][0].double())
        weights.append(len(piece))
    w = torch.tensor(weights, dtype=torch.float64)
    mean = (torch.stack(pooled) * w[:, None]).sum(0) / w.sum()
    features = {"sentence_embedding": mean.float()[None]}
    with torch.no_grad():
        for module in list(model)[2:]:
            features = module(features)
    return features["sentence_embedding"][0].numpy()


def handler_for(folder, engine, tmp_path, **section):
    model_dir = engine_model_dir(folder, engine, "embedding", tmp_path / f"{engine}-{folder.name}")
    return make_handler(model_dir, engine=engine, max_length=MAX_LENGTH, **section)


def close(got, expected):
    diff = float(np.max(np.abs(np.asarray(got) - expected)))
    assert diff <= TOLERANCE, diff


@pytest.mark.parametrize(
    ("engine", "variant"),
    [*((e, v) for e in ("torch", "onnxruntime") for v in VARIANTS), ("openvino", "prompt-excluded")],
)
def test_chunked_texts_equal_sentence_transformers_windows_pooled(folders, variant, engine, tmp_path):
    folder = folders[variant]
    handler, context = handler_for(folder, engine, tmp_path)
    texts = long_texts(6, seed=3) + ["short"]
    prompt_name = "query" if "prompts" in VARIANTS[variant] else None
    named = {"prompt_name": prompt_name} if prompt_name else {}
    rows = [
        {"body": {"texts": texts[:3], "on_overflow": "chunk", **named}},
        {"body": {"texts": ["an ordinary text", *texts[3:]], "on_overflow": "chunk", **named}},
        {"body": {"texts": [max(texts, key=len)], **named}},  # truncated, beside the windows in the same passes
    ]
    (s1, a1), (s2, a2), (s3, a3) = serve(handler, context, rows)
    assert (s1, s2, s3) == (200, 200, 200)
    prompt = VARIANTS[variant].get("prompts", {}).get("query", "")
    for text, answer in zip(texts[:3] + ["an ordinary text", *texts[3:]], a1 + a2):
        close(answer["embedding"], reference(folder, text, prompt))
        assert answer["truncated"] is False
    assert max(a["chunks"] for a in a1 + a2) > 2 and a2[0]["chunks"] == 1 and a2[-1]["chunks"] == 1
    assert all("chunks" not in a for a in a3) and any(a["truncated"] for a in a3)


@pytest.mark.parametrize("strategy", ["bucketed", "dynamic", "static"])
def test_chunked_answers_do_not_depend_on_strategy_batch_or_overlap_setting(folders, strategy, tmp_path):
    folder = folders["mean-normalize"]
    handler, context = handler_for(
        folder,
        "torch",
        tmp_path,
        strategy=strategy,
        on_overflow="chunk",
        chunk_tokens=12,
        chunk_overlap=4,
        max_chunks=64,
    )
    texts = long_texts(8, seed=9)
    together = serve(handler, context, [{"body": {"texts": texts}}])[0][1]
    for text, answer in zip(texts, together):
        ((status, alone),) = serve(handler, context, [{"body": {"text": text}}])
        assert status == 200 and alone["chunks"] == answer["chunks"]
        close(answer["embedding"], np.asarray(alone["embedding"]))
        close(answer["embedding"], reference(folder, text, tokens=12, overlap=4))


def test_answer_counts_tokens_and_windows_and_token_ids_chunk_as_their_text(folders, tmp_path):
    folder = folders["mean-normalize"]
    handler, context = handler_for(folder, "torch", tmp_path)
    text = long_texts(4, seed=1)[3]
    ids = sentence_transformers.SentenceTransformer(str(folder), device="cpu").tokenizer(
        text, add_special_tokens=False
    )["input_ids"]
    ((status, answer),) = serve(handler, context, [{"body": {"text": text, "on_overflow": "chunk"}}])
    assert status == 200
    assert answer["tokens"] == len(ids) + 2 and answer["chunks"] == -(-len(ids) // (MAX_LENGTH - 2))
    rows = [{"body": {"input": ids, "on_overflow": "chunk"}}]
    context.with_requests(["application/json"], ["v1/embeddings"])
    (body,) = handler.handle(rows, context)
    close(json.loads(body)["data"][0]["embedding"], np.asarray(answer["embedding"]))


def test_continuous_schedule_pools_windows_across_calls(folders, tmp_path):
    folder = folders["cls"]
    model_dir = engine_model_dir(folder, "torch", "embedding", tmp_path / "cont")
    handler, context = continuous(model_dir, max_length=MAX_LENGTH, on_overflow="chunk", slice_ms=1.0)
    front = ContinuousFrontend(handler, context, batch_size=8)
    texts = long_texts(5, seed=4)
    front.submit("long", {"body": {"texts": texts}})
    assert front.step() == []  # its windows run over several calls
    front.drain()
    status, body, _ = front.answers["long"]
    assert status == 200
    for text, answer in zip(texts, json.loads(body)):
        close(answer["embedding"], reference(folder, text))


def test_refusals_are_one_line_each(folders, tmp_path):
    dense = build_sentence_transformer(tmp_path / "dense", dense=((16, True, "Tanh"),))
    handler, context = handler_for(dense, "torch", tmp_path)
    ((status, body),) = serve(handler, context, [{"body": {"text": "x", "on_overflow": "chunk"}}])
    assert status == 400 and "Dense layers" in body["message"] and "\n" not in body["message"]
    with pytest.raises(Exception, match="handler.on_overflow: got 'chunk'; it is not served for a model whose"):
        handler_for(dense, "torch", tmp_path / "again", on_overflow="chunk")

    handler, context = handler_for(folders["cls"], "torch", tmp_path, max_chunks=2)
    rows = [
        {"body": {"text": " ".join(["word"] * 200), "on_overflow": "chunk"}},
        {"body": {"text": "x", "on_overflow": "chunk", "truncate": True}},
        {"body": {"text": "x", "on_overflow": "split"}},
        {"body": {"text": " ".join(["word"] * 40), "on_overflow": "chunk"}},
    ]
    (s1, b1), (s2, b2), (s3, b3), (s4, _) = serve(handler, context, rows)
    assert s1 == 413 and "more than max_chunks=2 windows of 30 tokens" in b1["message"]
    assert s2 == 400 and 'send "on_overflow" or "truncate", not both' in b2["message"]
    assert s3 == 400 and "\"on_overflow\" must be one of 'truncate', 'reject', 'chunk'" in b3["message"]
    assert s4 == 200


def test_a_huge_text_is_refused_after_reading_a_bounded_prefix(folders, tmp_path):
    handler, context = handler_for(folders["cls"], "torch", tmp_path, max_chunks=4)
    text = "word " * 2_000_000  # 10 MB
    ((status, body),) = serve(handler, context, [{"body": {"text": text, "on_overflow": "chunk"}}])
    assert status == 413 and "more than max_chunks=4 windows" in body["message"]


@pytest.mark.parametrize(
    ("engine", "pooling"),
    [*((e, p) for e in ("torch", "onnxruntime") for p in ("max", "sum")), ("openvino", "max")],  # openvino: no sum
)
def test_a_splade_models_windows_combine_as_its_tokens_pool(engine, pooling, tmp_path):
    from tests.models import build_sparse_encoder

    folder = build_sparse_encoder(tmp_path / f"splade-{pooling}", pooling=pooling)
    model_dir = engine_model_dir(folder, engine, "sparse", tmp_path / f"{engine}-splade")
    handler, context = make_handler(model_dir, engine=engine, task="sparse", max_length=MAX_LENGTH)
    text = long_texts(4, seed=1)[3]
    ((status, answer),) = serve(handler, context, [{"body": {"text": text, "on_overflow": "chunk"}}])
    assert status == 200 and answer["chunks"] > 2
    model = sentence_transformers.SparseEncoder(str(folder), device="cpu")
    tok = model.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    window = MAX_LENGTH - 2
    rows = []
    for start in range(0, len(ids), window):
        row = torch.tensor([[tok.cls_token_id, *ids[start : start + window], tok.sep_token_id]])
        features = {"input_ids": row, "attention_mask": torch.ones_like(row), "token_type_ids": torch.zeros_like(row)}
        with torch.no_grad():
            rows.append(model[1](model[0](features))["sentence_embedding"][0].double())
    stacked = torch.stack(rows)
    expected = (stacked.max(0).values if pooling == "max" else stacked.sum(0)).float().numpy()
    got = np.zeros_like(expected)
    got[answer["embedding"]["indices"]] = answer["embedding"]["values"]
    close(got, expected)


def test_a_sparse_router_with_a_static_route_refuses_chunk(tmp_path):
    from tests.models import build_sparse_encoder

    folder = build_sparse_encoder(tmp_path / "router", router=True)
    handler, context = make_handler(folder, task="sparse", max_length=MAX_LENGTH)
    ((status, body),) = serve(handler, context, [{"body": {"text": "x", "on_overflow": "chunk"}}])
    assert status == 400 and "is served for SPLADE models" in body["message"] and "is not SPLADE" in body["message"]


@pytest.mark.parametrize("overlap", [30, 31])
def test_an_overlap_no_window_can_hold_is_refused_at_start_in_one_line(folders, tmp_path, overlap):
    """At max_length 32 a window holds 30 of a text's tokens (BERT's [CLS] and [SEP] take 2): an overlap of 30 or 31
    passed the settings check (against max_length), the worker started, and then every long text was a 413 blaming a
    prompt the request did not have. The worker now refuses it at start, naming the real window."""
    from bucketing.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        handler_for(folders["cls"], "torch", tmp_path / str(overlap), chunk_overlap=overlap)
    message = str(caught.value)
    assert message == (
        f"handler.chunk_overlap: got {overlap}; allowed: fewer than a window's tokens (30: chunk_tokens, else "
        "max_length=32 less this model's 2 special tokens)"
    )
    handler, context = handler_for(folders["cls"], "torch", tmp_path / "fits", chunk_overlap=29)
    ((status, body),) = serve(handler, context, [{"body": {"text": " ".join(["word"] * 40), "on_overflow": "chunk"}}])
    assert status == 200 and body["chunks"] == 11  # 40 tokens in windows of 30, each one token on from the last


def test_a_default_prompt_that_leaves_no_window_is_refused_at_start(folders, tmp_path):
    """The model's default prompt leads every text that names none: its tokens shrink every such window."""
    from bucketing.config import ConfigError

    with pytest.raises(ConfigError, match=r"handler.chunk_overlap: got 25; .*and the default prompt 'query''s \d+\)"):
        handler_for(folders["prompt-excluded"], "torch", tmp_path, chunk_overlap=25, default_prompt_name="query")
