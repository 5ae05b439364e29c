"""Our answer equals sentence-transformers' own `encode()` (within 1e-5 per component) for folders it saved itself:
every pooling mode, Dense chains, Normalize or not, prompts, `include_prompt: false`, the legacy layout, on BERT,
RoBERTa and DistilBERT bodies, on every engine and strategy, texts batched with others."""

from __future__ import annotations

from typing import Any

import pytest

from model_store.archives import engine_model_dir
from tests.handler.test_handler import make_handler, mixed_texts, serve
from tests.models import build_sentence_transformer

np = pytest.importorskip("numpy")
sentence_transformers = pytest.importorskip("sentence_transformers")

TOLERANCE = 1e-5
VARIANTS: dict[str, dict[str, Any]] = {
    "cls": {"pooling": "cls"},
    "max": {"pooling": "max"},
    "mean-normalize": {"pooling": "mean", "normalize": True},
    "mean_sqrt_len": {"pooling": "mean_sqrt_len_tokens"},
    "weightedmean": {"pooling": "weightedmean"},
    "lasttoken": {"pooling": "lasttoken"},
    "cls+mean+max": {"pooling": ("cls", "mean", "max")},
    "dense-chain": {"dense": ((24, True, "Tanh"), (16, False, "Identity")), "normalize": True},
    "prompts": {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt": "query"},
    "prompt-excluded": {
        "pooling": "cls",
        "prompts": {"query": "Represent this sentence for searching: "},
        "include_prompt": False,
        "normalize": True,
    },
    "roberta-cls": {"arch": "roberta", "pooling": "cls", "normalize": True, "max_seq_length": 120},
    "roberta-prompt-excluded": {
        "arch": "roberta",
        "pooling": "weightedmean",
        "include_prompt": False,
        "prompts": {"query": "query: "},
        "max_seq_length": 120,
    },
    "distilbert-dense": {"arch": "distilbert", "dense": ((8, True, "ReLU"),), "max_seq_length": 120},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("st")
    return {name: build_sentence_transformer(root / name, **spec) for name, spec in VARIANTS.items()}


def reference(folder, texts, **kwargs):
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    return model.encode(texts, batch_size=len(texts), convert_to_numpy=True, **kwargs)


def ours(folder, engine, texts, tmp_path, strategy="bucketed", dtype="float32", **options):
    model_dir = engine_model_dir(folder, engine, "embedding", tmp_path / f"{engine}-{folder.name}")
    length = VARIANTS.get(folder.name, {}).get("max_seq_length", 128)
    handler, context = make_handler(model_dir, engine=engine, strategy=strategy, max_length=length, dtype=dtype)
    half = len(texts) // 2  # two requests in one delivered batch, so each is planned with the other's texts
    rows = [{"body": {"texts": texts[:half], **options}}, {"body": {"texts": texts[half:], **options}}]
    answers = serve(handler, context, rows)
    assert [s for s, _ in answers] == [200, 200], answers
    return np.array([a["embedding"] for _, body in answers for a in body])


def close(got, expected):
    assert got.shape == expected.shape
    diff = float(np.max(np.abs(got - expected)))
    assert diff <= TOLERANCE, diff


@pytest.mark.parametrize("engine", ["torch", "onnxruntime", "openvino"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_chain_answers_as_sentence_transformers_encodes(folders, variant, engine, tmp_path):
    texts = mixed_texts(8, seed=5)[:7] + ["short"]
    close(ours(folders[variant], engine, texts, tmp_path), reference(folders[variant], texts))


@pytest.mark.parametrize(
    ("variant", "engine"),
    [(v, "torch") for v in VARIANTS] + [(v, "openvino") for v in ("mean-normalize", "dense-chain", "roberta-cls")],
)
def test_each_chain_in_bfloat16_keeps_its_cosine_to_float32(folders, variant, engine, tmp_path, bf16_cpu, request):
    """bfloat16 (on a CPU that multiplies it natively; on openvino, where OpenVINO runs it): every pooling mode,
    Dense, prompts, within cosine 0.999 of sentence-transformers' float32 encode() (not 1e-5: the encoder runs in
    bfloat16)."""
    if engine == "openvino":
        request.getfixturevalue("openvino_bf16")
    texts = mixed_texts(8, seed=5)[:7] + ["short"]
    got = ours(folders[variant], engine, texts, tmp_path, dtype="bfloat16")
    expected = reference(folders[variant], texts)
    assert got.shape == expected.shape
    cosine = np.sum(got * expected, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosine.min() >= 0.999, cosine.min()


@pytest.mark.parametrize("strategy", ["dynamic", "static"])
def test_every_strategy_answers_the_same(folders, strategy, tmp_path):
    texts = mixed_texts(6, seed=6)
    folder = folders["prompt-excluded"]
    close(ours(folder, "torch", texts, tmp_path, strategy), reference(folder, texts))


def test_prompt_names_a_raw_prompt_and_the_default(folders, tmp_path):
    folder, texts = folders["prompts"], mixed_texts(4, seed=7)
    close(ours(folder, "torch", texts, tmp_path), reference(folder, texts))  # the default: query
    close(
        ours(folder, "torch", texts, tmp_path, prompt_name="passage"), reference(folder, texts, prompt_name="passage")
    )
    close(ours(folder, "torch", texts, tmp_path, prompt="custom: "), reference(folder, texts, prompt="custom: "))
    close(ours(folder, "torch", texts, tmp_path, prompt=""), reference(folder, texts, prompt=""))


def test_normalize_and_dimensions_on_request(folders, tmp_path):
    folder, texts = folders["dense-chain"], mixed_texts(4, seed=8)
    raw = ours(folder, "torch", texts, tmp_path, normalize=False)
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    unnormalized = model.encode(texts, convert_to_numpy=True, output_value="sentence_embedding")
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)  # the chain's Normalize left out on request
    close(raw / np.linalg.norm(raw, axis=1, keepdims=True), unnormalized)
    cut = ours(folder, "torch", texts, tmp_path, dimensions=4)
    expected = reference(folder, texts, truncate_dim=4)
    close(cut, expected / np.linalg.norm(expected, axis=1, keepdims=True))


def test_an_unknown_prompt_name_is_a_400_listing_the_prompts(folders):
    handler, context = make_handler(folders["prompts"], max_length=128)
    ((status, body),) = serve(handler, context, [{"body": {"text": "x", "prompt_name": "qeury"}}])
    assert status == 400 and body["message"] == (
        "\"prompt_name\" 'qeury' is not a prompt of this model; its prompts: 'document', 'passage', 'query'"
    )


def test_the_shipped_minilm_equals_sentence_transformers_on_real_prose(minilm_dir, tmp_path):
    """The legacy layout (sentence_bert_config.json, pooling_mode_* keys, a Normalize without a folder)."""
    texts = [
        "TorchServe hands the handler a list of requests.",
        "Dynamic padding pads the batch to its longest text, so a short query shares the cost of a long passage.",
        "Un texte en français, avec des accents.",
        "A much longer passage about serving transformer encoders in production, where requests have very "
        "different lengths and most of the compute of a padded batch goes into padding tokens. " * 3,
    ]
    expected = reference(minilm_dir, texts)
    for engine in ("torch", "onnxruntime", "openvino"):
        graph = "onnxruntime" if engine == "openvino" else engine  # openvino runs onnxruntime's graph: one export
        model_dir = engine_model_dir(minilm_dir, graph, "embedding", tmp_path / graph)
        handler, context = make_handler(model_dir, engine=engine, max_length=256)
        ((status, body),) = serve(handler, context, [{"body": {"texts": texts}}])
        assert status == 200
        close(np.array([a["embedding"] for a in body]), expected)


@pytest.mark.parametrize(
    "module_type",
    [
        "sentence_transformers.models.CLIPModel",
        "sentence_transformers.models.Asym",
        "sentence_transformers.sentence_transformer.modules.word_embeddings.WordEmbeddings",
        "sentence_transformers.models.LSTM",
    ],
)
def test_a_module_we_cannot_serve_stops_the_build_and_the_worker_in_one_line(folders, tmp_path, module_type):
    import json
    import shutil

    from bucketing.model.head import EngineError
    from model_store import archives, build

    folder = tmp_path / "odd"
    shutil.copytree(folders["cls"], folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Odd", "type": module_type})
    (folder / "modules.json").write_text(json.dumps(modules))
    expected = f"module {module_type!r} in {folder / '2_Odd'} is not served (served: Transformer, Pooling, Dense, "
    with pytest.raises(archives.ModelFolderError) as e:
        archives.check_model_dir(folder, "embedding")
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)
    assert build.main(["--model-dir", str(folder), "--out", str(tmp_path / "store")]) == 2
    with pytest.raises(EngineError, match="is not served"):
        make_handler(folder, max_length=128)


def test_the_build_records_the_chain_and_writes_prompts(folders, tmp_path, capsys):
    import yaml

    from model_store import build

    stage = tmp_path / "stage"
    argv = [
        "--model-dir",
        str(folders["prompt-excluded"]),
        "--name",
        "bge",
        "--strategies",
        "bucketed",
        "--engine",
        "torch",
        "--print-commands",
        "--stage-dir",
        str(stage),
        "--prompt",
        "query=query: ",
        "--prompt",
        "passage=passage: ",
        "--default-prompt",
        "passage",
    ]
    assert build.main(argv) == 0
    cfg = yaml.safe_load((stage / "bge-bucketed.yaml").read_text())
    assert cfg["handler"]["prompts"] == {"query": "query: ", "passage": "passage: "}
    assert cfg["handler"]["default_prompt_name"] == "passage"
    assert cfg["model_chain"]["pooling"] == ["cls"] and cfg["model_chain"]["include_prompt"] is False
    assert cfg["model_chain"]["normalize"] is True
    assert cfg["handler"]["max_length"] == 512  # where sentence-transformers cuts: its tokenizer's model_max_length
    assert sorted(p.name for p in (stage / "extra" / "model").iterdir() if p.is_dir()) == ["1_Pooling", "2_Normalize"]
    section = {k: v for k, v in cfg["handler"].items() if k != "model_path"} | {"cost": {"calibrate": False}}
    handler, context = make_handler(stage / "extra" / "model", **section)
    texts = mixed_texts(3, seed=9)
    ((status, body),) = serve(handler, context, [{"body": {"texts": texts}}])  # the build's default: passage
    close(np.array([a["embedding"] for a in body]), reference(folders["prompt-excluded"], texts, prompt="passage: "))
    assert build.main([*argv[:-1], "nope"]) == 2
    assert "--default-prompt 'nope': not a prompt" in capsys.readouterr().err


def test_truncation_on_request_right_left_or_refused(minilm_dir):
    """`truncate: false` is that request's 413; `truncation_direction: left` keeps a text's last tokens, as
    sentence-transformers does with its tokenizer's truncation_side set to left."""
    long = " ".join(f"word{i} of a long passage" for i in range(200))
    handler, context = make_handler(minilm_dir, max_length=64)
    (refused, right, left, plain) = serve(
        handler,
        context,
        [
            {"body": {"text": long, "truncate": False}},
            {"body": {"text": long, "truncation_direction": "right"}},
            {"body": {"text": long, "truncation_direction": "left"}},
            {"body": {"text": "short", "truncate": False}},
        ],
    )
    assert refused[0] == 413 and "(truncate: false)" in refused[1]["message"] and plain[0] == 200
    model = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    model.max_seq_length = 64
    close(np.array(right[1]["embedding"]), model.encode([long])[0])
    model.tokenizer.truncation_side = "left"
    close(np.array(left[1]["embedding"]), model.encode([long])[0])
    assert right[1]["truncated"] and left[1]["truncated"]


def test_a_left_cut_with_an_excluded_prompt_is_refused(folders):
    handler, context = make_handler(folders["prompt-excluded"], max_length=128)
    ((status, body),) = serve(
        handler, context, [{"body": {"text": "x", "prompt": "q: ", "truncation_direction": "left"}}]
    )
    assert status == 400 and body["message"].startswith('truncation_direction "left" with a prompt is not served')


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from tests.models import build_gemma3

    return build_gemma3(tmp_path_factory.mktemp("gemma3") / "gemma3", window=8)


@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
def test_a_gemma3_model_with_a_sliding_window_answers_as_sentence_transformers(gemma3, engine, tmp_path):
    """EmbeddingGemma's shape (bidirectional attention, a sliding window, two Dense layers): its graph exports (the
    masks from plain tensor ops) and both engines answer as encode() at lengths well past the 8-token window."""
    texts = mixed_texts(8, seed=5)[:7] + ["short"]
    model = sentence_transformers.SentenceTransformer(str(gemma3), device="cpu")
    assert max(len(model.tokenizer(t)["input_ids"]) for t in texts) > 4 * 8
    model_dir = engine_model_dir(gemma3, engine, "embedding", tmp_path / engine)
    handler, context = make_handler(model_dir, engine=engine, max_length=model.max_seq_length)
    ((status, body),) = serve(handler, context, [{"body": {"texts": texts}}])
    assert status == 200
    close(np.array([a["embedding"] for a in body]), reference(gemma3, texts))


def test_a_graph_that_does_not_export_is_one_line_naming_the_torch_engine(gemma3, tmp_path, capsys, monkeypatch):
    import torch

    from model_store import build

    def fails(*args, **kwargs):
        raise RuntimeError("unordered_map::at")

    monkeypatch.setattr(torch.onnx, "export", fails)
    argv = ["--model-dir", str(gemma3), "--engine", "onnxruntime", "--strategies", "bucketed", "--print-commands"]
    assert build.main([*argv, "--stage-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "Traceback" not in err
    assert "the ONNX export of this gemma3_text model failed (RuntimeError: unordered_map::at); build it with " in err
    assert err.endswith("--engine torch, which serves it exactly")


def test_request_prompts_are_not_kept_without_bound(folders, tmp_path):
    """A pooling that leaves the prompt out counts each prompt's tokens; a request's own prompts are counted in a
    bounded cache (4000 distinct 4 KB prompts once kept 107 MB), and an answer stays exact after eviction."""
    from bucketing.model.tokenizer import PROMPT_CACHE

    folder = folders["prompt-excluded"]
    handler, context = make_handler(folder, max_length=128)
    rows = [{"body": {"text": "a short text", "prompt": f"prompt {i}: "}} for i in range(3 * PROMPT_CACHE)]
    assert all(status == 200 for status, _ in serve(handler, context, rows))
    assert len(handler.tokenizer._prompt_lengths) == PROMPT_CACHE
    texts = mixed_texts(3, seed=10)
    ((status, body),) = serve(handler, context, [{"body": {"texts": texts, "prompt": "prompt 0: "}}])  # evicted
    close(np.array([a["embedding"] for a in body]), reference(folder, texts, prompt="prompt 0: "))


def test_token_ids_are_refused_with_a_prompt_and_equal_their_text_without_one(folders):
    """The tokens of prompt + text are not always the prompt's then the text's (a byte-level BPE joins the space
    after the prompt to the first word), so token ids with a prompt (the model's default, a named one or a
    request's) are refused, saying why; with `"prompt": ""` they are the text's embedding, `encode(text, prompt="")`."""
    import json

    from transformers import AutoTokenizer

    folder = folders["prompts"]
    text = mixed_texts(6, seed=13)[2]
    ids = AutoTokenizer.from_pretrained(folder)(text, add_special_tokens=False)["input_ids"]
    handler, context = make_handler(folder, max_length=128)
    bodies = [
        {"input": ids},
        {"input": [ids], "prompt_name": "passage"},
        {"input": ids, "prompt": "custom: "},
        {"input": ids, "prompt": ""},
        {"input": text, "prompt": ""},
        {"input": [text], "prompt_name": "passage"},
    ]
    context.with_requests(["application/json"] * len(bodies), ["v1/embeddings"] * len(bodies))
    replies = [json.loads(r) for r in handler.handle([{"body": b} for b in bodies], context)]
    statuses = [context.status[i][0] for i in range(len(bodies))]
    assert statuses == [400, 400, 400, 200, 200, 200], replies
    default, named, own = (r["error"] for r in replies[:3])
    assert "the model's default prompt 'query'" in default["message"] and default["param"] == "input"
    assert "\"prompt_name\" 'passage'" in named["message"] and 'a "prompt"' in own["message"]
    assert all('send the text, or "prompt": ""' in e["message"] for e in (default, named, own))
    got = np.array([r["data"][0]["embedding"] for r in replies[3:]])
    close(got[:2], reference(folder, [text, text], prompt=""))
    close(got[2:], reference(folder, [text], prompt_name="passage"))


def test_an_excluded_prompt_is_counted_as_sentence_transformers_counts_it_without_an_end_token(tmp_path):
    """sentence-transformers leaves out of pooling the prompt's tokens with its special tokens, less a trailing
    special one: a tokenizer that adds only a start token (Llama-style) leaves out one token more than a
    [CLS] ... [SEP] one, not one fewer (was 0.79 off with a 200)."""
    import json

    spec: dict[str, Any] = {
        "arch": "roberta",
        "include_prompt": False,
        "prompts": {"query": "query: "},
        "max_seq_length": 120,
    }
    folder = build_sentence_transformer(tmp_path / "bos-only", **spec)
    config = json.loads((folder / "tokenizer.json").read_text())
    single = config["post_processor"]["single"]
    config["post_processor"]["single"] = [t for t in single if t.get("SpecialToken", {}).get("id") != "</s>"]
    (folder / "tokenizer.json").write_text(json.dumps(config))
    texts = mixed_texts(4, seed=14)
    handler, context = make_handler(folder, max_length=120)
    ((status, body),) = serve(handler, context, [{"body": {"texts": texts, "prompt_name": "query"}}])
    assert status == 200 and handler.tokenizer.suffix == ()
    close(np.array([a["embedding"] for a in body]), reference(folder, texts, prompt_name="query"))
