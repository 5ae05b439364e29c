"""The long workload's generated model (bench.models.bert_long_random: a BERT of `positions` position embeddings
saved by sentence-transformers, mean pooling and Normalize, MiniLM's tokenizer at `model_max_length` = positions),
built here at 2,048 positions by the same code as the bench's 8,192 (an 8k pass and its reference take half a
minute on 2 cores): sentence-transformers reads it at that limit, and our answer to a document of exactly that many
tokens, run whole, equals its `encode()` within 1e-5 on both engines; late chunking answers one vector per
sentence of it; at a 512-token registration, `on_overflow: chunk` answers its windows' weighted mean."""

from __future__ import annotations

import json

import pytest

from bench.inputs import models
from bench.inputs.workloads import long_documents
from bucketing.chunks import sentences
from model_store.archives import check_model_dir, engine_model_dir
from tests.handler.test_handler import make_handler, serve

np = pytest.importorskip("numpy")
sentence_transformers = pytest.importorskip("sentence_transformers")

TOLERANCE = 1e-5
POSITIONS = 2048


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return models.bert_long_random(tmp_path_factory.mktemp("bench-models") / "long-2k", POSITIONS)


@pytest.fixture(scope="module")
def document():
    (doc,) = long_documents(1, seed=5, low=POSITIONS, high=POSITIONS).texts
    return doc


@pytest.fixture(scope="module")
def model(folder):
    return sentence_transformers.SentenceTransformer(str(folder), device="cpu")


def test_sentence_transformers_reads_it_at_its_positions(folder, model):
    assert [type(m).__name__ for m in model] == ["Transformer", "Pooling", "Normalize"]
    assert model.max_seq_length == POSITIONS and model.tokenizer.model_max_length == POSITIONS
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "mean"
    config = json.loads((folder / "config.json").read_text())
    assert config["max_position_embeddings"] == POSITIONS
    assert {k: config[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads")} == {
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
    }
    assert check_model_dir(folder, "embedding") == POSITIONS  # model_store.build archives it at this limit


@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
def test_a_document_of_its_whole_limit_equals_encode(folder, model, document, engine, tmp_path):
    expected = model.encode([document])[0]
    model_dir = engine_model_dir(folder, engine, "embedding", tmp_path / engine)
    handler, context = make_handler(model_dir, engine=engine, max_length=POSITIONS)
    ((status, (answer,)),) = serve(handler, context, [{"body": {"texts": [document]}}])
    assert status == 200 and answer["tokens"] == POSITIONS and not answer["truncated"]
    assert float(np.max(np.abs(np.asarray(answer["embedding"]) - expected))) <= TOLERANCE
    late = {"texts": [document], "chunking": "late", "spans": "sentences"}
    ((status, (answer,)),) = serve(handler, context, [{"body": late}])
    assert status == 200 and len(answer["chunks"]) == len(sentences(document)) and not answer["truncated"]


def test_chunked_at_512_is_its_windows_weighted_mean(folder, model, document):
    handler, context = make_handler(folder, engine="torch", max_length=512)
    ((status, (answer,)),) = serve(handler, context, [{"body": {"texts": [document], "on_overflow": "chunk"}}])
    assert status == 200 and answer["chunks"] == 5 and answer["tokens"] == POSITIONS  # 2,046 own tokens / 510
    import torch

    tok = model.tokenizer
    ids = tok(document, add_special_tokens=False)["input_ids"]
    windows = [ids[s : s + 510] for s in range(0, len(ids), 510)]  # sentence-transformers' modules on each window
    pooled = []
    for window in windows:
        row = torch.tensor([[tok.cls_token_id, *window, tok.sep_token_id]])
        features = {"input_ids": row, "attention_mask": torch.ones_like(row), "token_type_ids": torch.zeros_like(row)}
        with torch.no_grad():
            pooled.append(model[1](model[0](features))["sentence_embedding"][0].double().numpy())
    weights = np.array([len(w) for w in windows], dtype=np.float64)
    combined = (weights[:, None] * np.array(pooled)).sum(axis=0) / weights.sum()
    expected = combined / np.linalg.norm(combined)  # its Normalize
    assert float(np.max(np.abs(np.asarray(answer["embedding"]) - expected))) <= TOLERANCE
