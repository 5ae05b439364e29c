"""Multi-vector (ColBERT-style) models in process: our answer equals sentence-transformers 6.2's own
`MultiVectorEncoder(dir).encode()` / `encode_query()` / `encode_document()` (the same kept tokens, each vector within
1e-5) for tiny random folders it saved itself: prefixes, skiplists, query expansion (fixed and min, attended or not),
query/document lengths, Dense layers, Normalize or not; on every engine, every strategy, queries and documents
batched together. Our native route and TEI's /embed_all serve them; every other route refuses them in one line; an
answer over max_response_bytes is a 413 while the rest of the batch is served; token pooling is refused."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest

from model_store.archives import engine_model_dir
from tests.handler.test_handler import count_forward_rows, make_handler, mixed_texts, serve
from tests.models import build_multi_vector_encoder

np = pytest.importorskip("numpy")
sentence_transformers = pytest.importorskip("sentence_transformers")

TOLERANCE = 1e-5
MAX_LENGTH = 64
VARIANTS: dict[str, dict[str, Any]] = {
    # classic ColBERT: [Q]/[D]-style prefixes, punctuation skipped in documents, queries fixed at 16 tokens
    "colbert": {
        "dense": ((12, False, "Identity"),),
        "skiplist": tuple(string.punctuation),
        "prompts": {"query": "[unused0] ", "document": "[unused1] "},
        "query_length": 16,
        "document_length": 40,
        "expansion": {"strategy": "fixed", "attend": False, "length": 16},
    },
    # expansion as a floor the encoder attends, a skiplist on both sides, a default prompt, no Normalize
    "min-attend": {
        "normalize": False,
        "skiplist": (",", ".", "!"),
        "skiplist_tasks": ("query", "document"),
        "prompts": {"query": "query: "},
        "default_prompt": "query",
        "query_length": 24,
        "expansion": {"strategy": "min", "attend": True, "length": 12},
    },
    # no query/document handling at all: a Dense chain over every token
    "dense-chain": {"dense": ((24, True, "Tanh"), (8, False, "Identity")), "max_seq_length": 48},
}
INPUT_TYPES = (None, "query", "document")
PUNCTUATED = ["hello, world! (note) don't -- stop.", "short", "a?", "x " * 70]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mve")
    return {name: build_multi_vector_encoder(root / name, **spec) for name, spec in VARIANTS.items()}


def texts_for(seed: int) -> list[str]:
    return mixed_texts(6, seed=seed) + PUNCTUATED


def reference(folder, texts, input_type):
    model = sentence_transformers.MultiVectorEncoder(str(folder), device="cpu")
    encode = {None: model.encode, "query": model.encode_query, "document": model.encode_document}[input_type]
    return [np.asarray(e) for e in encode(texts, batch_size=len(texts), convert_to_numpy=True)]


def handler_for(folder, engine, tmp_path, **section):
    model_dir = engine_model_dir(folder, engine, "multivector", tmp_path / f"{engine}-{folder.name}")
    length = VARIANTS[folder.name].get("max_seq_length", MAX_LENGTH)
    return make_handler(model_dir, task="multivector", engine=engine, max_length=length, **section)


def mismatches(got, expected) -> list[str]:
    """What differs: a text whose kept-token count differs, or a vector off by more than TOLERANCE."""
    out = []
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        g = np.asarray(g, dtype=np.float32).reshape(-1, e.shape[-1]) if len(g) else np.zeros((0, e.shape[-1]))
        if g.shape != e.shape:
            out.append(f"text {i}: {g.shape[0]} vectors, expected {e.shape[0]}")
        elif g.size and float(np.max(np.abs(g - e))) > TOLERANCE:
            out.append(f"text {i}: off by {float(np.max(np.abs(g - e))):.2e}")
    return out


def served(handler, context, texts, input_types):
    """One delivered batch: for each input type, the texts split into two requests, all planned together."""
    rows, owners = [], []
    for t in input_types:
        options = {"input_type": t} if t else {}
        half = len(texts) // 2
        rows += [{"body": {"texts": texts[:half], **options}}, {"body": {"texts": texts[half:], **options}}]
        owners += [t, t]
    answers = serve(handler, context, rows)
    assert all(status == 200 for status, _ in answers), answers
    out: dict = {t: [] for t in input_types}
    for t, (_, body) in zip(owners, answers):
        out[t] += [a["embeddings"] for a in body]
    return out


@pytest.mark.parametrize("engine", ["torch", "onnxruntime", "openvino"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_answers_as_multi_vector_encoder(folders, variant, engine, tmp_path):
    handler, context = handler_for(folders[variant], engine, tmp_path)
    texts = texts_for(seed=7)
    got = served(handler, context, texts, INPUT_TYPES)  # queries, documents and neither in one batch
    for t in INPUT_TYPES:
        assert mismatches(got[t], reference(folders[variant], texts, t)) == [], t


@pytest.mark.parametrize("strategy", ["dynamic", "static"])
def test_other_strategies_answer_the_same(folders, strategy, tmp_path):
    handler, context = handler_for(folders["colbert"], "torch", tmp_path, strategy=strategy)
    texts = texts_for(seed=11)
    got = served(handler, context, texts, INPUT_TYPES)
    for t in INPUT_TYPES:
        assert mismatches(got[t], reference(folders["colbert"], texts, t)) == [], t


def test_an_answer_does_not_depend_on_its_batch(folders, tmp_path):
    handler, context = handler_for(folders["min-attend"], "torch", tmp_path, max_batch_tokens=96)
    texts = texts_for(seed=3)
    expected = reference(folders["min-attend"], texts, "query")
    for size in (1, 3, len(texts)):
        rows = [{"body": {"texts": texts[i : i + size], "input_type": "query"}} for i in range(0, len(texts), size)]
        answers = serve(handler, context, rows)
        got = [a["embeddings"] for _, body in answers for a in body]
        assert mismatches(got, expected) == [], size


def test_a_single_text_answers_one_object_with_its_tokens(folders, tmp_path):
    handler, context = handler_for(folders["colbert"], "torch", tmp_path)
    ((status, body),) = serve(handler, context, [{"body": {"text": "hello, world", "input_type": "query"}}])
    assert status == 200 and set(body) == {"embeddings", "tokens", "truncated"}
    assert body["tokens"] == 16 and not body["truncated"]  # the model ran the expanded query
    assert mismatches([body["embeddings"]], reference(folders["colbert"], ["hello, world"], "query")) == []
    ((status, body),) = serve(handler, context, [{"body": {"text": "x " * 80, "input_type": "document"}}])
    assert status == 200 and body["tokens"] == 40 and body["truncated"]


def test_embed_all_is_teis_token_embeddings(folders, tmp_path):
    handler, context = handler_for(folders["colbert"], "torch", tmp_path)
    texts = texts_for(seed=5)
    rows = [{"inputs": texts, "input_type": "document"}, {"inputs": texts[0]}, {"inputs": texts[:2], "extra": 1}]
    context.with_requests(["application/json"] * 3, ["embed_all"] * 3)
    bodies = handler.handle([{"body": r} for r in rows], context)
    (s1, a), (s2, b), (s3, c) = [(context.status[i][0], json.loads(x)) for i, x in enumerate(bodies)]
    assert (s1, s2, s3) == (200, 200, 200)
    assert mismatches(a, reference(folders["colbert"], texts, "document")) == []
    assert len(b) == 1 and mismatches(b, reference(folders["colbert"], texts[:1], None)) == []
    assert mismatches(c, reference(folders["colbert"], texts[:2], None)) == []


def test_tei_info_says_an_embedding_model_that_pools_no_tokens(folders, tmp_path):
    """TEI has no multi-vector model type: /info says embedding, pooling "none" (was "mean"), and the rest as for
    any model."""
    handler, context = handler_for(folders["colbert"], "torch", tmp_path)
    context.with_requests(["application/json"], ["info"])
    (body,) = handler.handle([{"body": None}], context)
    info = json.loads(body)
    assert context.status[0][0] == 200 and info["model_type"] == {"embedding": {"pooling": "none"}}
    assert info["max_input_length"] == MAX_LENGTH and info["model_dtype"] == "float32"


def test_other_routes_refuse_a_multi_vector_model_in_one_line(folders, tmp_path):
    handler, context = handler_for(folders["colbert"], "torch", tmp_path)
    rows = [
        {"input": "a", "model": "tiny"},
        {"instances": ["a"]},
        {"inputs": "a"},
        {"inputs": "a"},
        {"text": "a", "input_type": "passage"},
    ]
    paths = ["v1/embeddings", "", "embed", "", ""]
    context.with_requests(["application/json"] * len(rows), paths)
    bodies = [json.loads(b) for b in handler.handle([{"body": r} for r in rows], context)]
    statuses = [context.status[i][0] for i in range(len(rows))]
    for status, body in zip(statuses[:4], bodies[:4]):
        message = json.dumps(body)
        assert status in (400, 422) and "multi-vector" in message and "embed_all" in message, body
        assert "\\n" not in message
    assert statuses[4] == 400 and bodies[4]["type"] == "InvalidRequest" and '"input_type"' in bodies[4]["message"]


def test_an_answer_over_max_response_bytes_is_a_413_and_the_rest_is_served(folders, tmp_path):
    handler, context = handler_for(folders["colbert"], "torch", tmp_path, max_response_bytes=40000)
    rows = [{"body": {"texts": ["x " * 80] * 8, "input_type": "document"}}, {"body": {"text": "short"}}]
    (s1, a), (s2, b) = serve(handler, context, rows)
    assert s1 == 413 and a["type"] == "ResponseTooLarge"
    assert "max_response_bytes" in a["message"] and "40000" in a["message"]
    assert s2 == 200 and mismatches([b["embeddings"]], reference(folders["colbert"], ["short"], None)) == []


def test_an_answer_known_too_large_is_refused_before_it_is_rendered(folders, tmp_path, monkeypatch):
    """Its size is known from its tokens: a 1.5 MB multi-vector request grew a worker by 2.2 GB rendering an answer
    only to refuse it. Its 413 now comes before anything is rendered, naming the least it would be; the rest of the
    batch is answered; a request that fits is rendered as before."""
    from bucketing.kinds.multivector.task import MultiVectorAnswer

    handler, context = handler_for(folders["colbert"], "torch", tmp_path, max_response_bytes=40000)
    rendered: list[int] = []
    fields = MultiVectorAnswer.fields

    def counted(self, options=None):
        rendered.append(1)
        return fields(self, options)

    monkeypatch.setattr(MultiVectorAnswer, "fields", counted)
    rows = [{"body": {"texts": ["x " * 80] * 40, "input_type": "document"}}, {"body": {"text": "short"}}]
    (s1, a), (s2, b) = serve(handler, context, rows)
    assert s1 == 413 and a["type"] == "ResponseTooLarge" and rendered == [1]  # only "short" was rendered
    assert a["message"].startswith("the answer would be at least ") and "over the 40000 bytes" in a["message"]
    assert s2 == 200 and mismatches([b["embeddings"]], reference(folders["colbert"], ["short"], None)) == []


def test_an_answer_its_tokens_show_too_large_runs_no_pass(folders, tmp_path, monkeypatch):
    """Its size is known from its tokens before any pass: the passes of a refused request ran (and held their
    vectors) only to be thrown away. Only the request that fits runs; the 413 says the same as after a pass."""
    from bucketing.kinds.multivector.task import MultiVectorTask

    handler, context = handler_for(folders["colbert"], "torch", tmp_path, max_response_bytes=40000)
    ran = count_forward_rows(monkeypatch, MultiVectorTask)
    rows = [{"body": {"texts": ["x " * 80] * 40, "input_type": "document"}}, {"body": {"text": "short"}}]
    (s1, a), (s2, b) = serve(handler, context, rows)
    assert s1 == 413 and a["type"] == "ResponseTooLarge" and sum(ran) == 1  # one row: "short"
    assert a["message"].startswith("the answer would be at least ") and "over the 40000 bytes" in a["message"]
    assert s2 == 200 and mismatches([b["embeddings"]], reference(folders["colbert"], ["short"], None)) == []


def test_token_pooling_is_refused_at_build_and_worker_start(folders, tmp_path):
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling

    from bucketing.model.head import EngineError
    from model_store.build import ArchiveSpec, BuildError

    model = MultiVectorEncoder(str(folders["colbert"]), device="cpu")
    model.append(HierarchicalTokenPooling(pool_factor=2))
    pooled = tmp_path / "pooled"
    model.save(str(pooled))
    with pytest.raises(EngineError, match="token pooling is not served") as e:
        make_handler(pooled, task="multivector", max_length=MAX_LENGTH)
    assert "\n" not in str(e.value)
    with pytest.raises(BuildError, match="token pooling is not served"):
        ArchiveSpec(strategies=("bucketed",), engine="torch", model_dir=pooled).configs()


def test_the_build_detects_a_multi_vector_folder(folders):
    from model_store.build import ArchiveSpec, BuildError

    configs = ArchiveSpec(strategies=("bucketed",), engine="torch", model_dir=folders["colbert"]).configs()
    (cfg,) = configs.values()
    assert cfg["handler"]["task"] == "multivector" and cfg["handler"]["max_length"] == MAX_LENGTH
    with pytest.raises(BuildError, match="--task multivector"):
        ArchiveSpec(strategies=("bucketed",), engine="torch", model_dir=folders["colbert"], task="embedding").configs()


def test_the_build_records_the_multi_vector_settings_in_the_model_config(folders):
    """The archive's model-config records what the build read of a multi-vector folder (`model_chain`, plain data, as
    for the embedding and sparse kinds; was: nothing): prompts, query/document lengths, expansion, Dense, mask."""
    import yaml

    from model_store.build import ArchiveSpec

    (cfg,) = ArchiveSpec(strategies=("bucketed",), engine="torch", model_dir=folders["colbert"]).configs().values()
    chain = yaml.safe_load(yaml.safe_dump(cfg))["model_chain"]  # plain data: what the archiver writes, read back
    assert chain["prompts"] == {"query": "[unused0] ", "document": "[unused1] "} and chain["normalize"] is True
    assert (chain["query_length"], chain["document_length"], chain["dense"]) == (16, 40, ["32->12 Identity"])
    assert chain["query_expansion"] == {"strategy": "fixed", "attend": False, "token": None, "length": 16}
    assert chain["skiplist_words"] == len(string.punctuation) and chain["skiplist_tasks"] == ["document"]
    (cfg,) = ArchiveSpec(strategies=("bucketed",), engine="torch", model_dir=folders["dense-chain"]).configs().values()
    assert cfg["model_chain"]["dense"] == ["32->24 Tanh", "24->8 Identity"]
    assert cfg["model_chain"]["query_expansion"] is None and cfg["model_chain"]["query_length"] is None


def test_embed_all_on_a_dense_model_is_teis_424(tiny_embedder_dir):
    handler, context = make_handler(tiny_embedder_dir, max_length=MAX_LENGTH)
    context.with_requests(["application/json"], ["embed_all"])
    (body,) = handler.handle([{"body": {"inputs": "a"}}], context)
    assert context.status[0][0] == 424 and json.loads(body)["error_type"] == "Backend"


def test_continuous_schedule_answers_as_multi_vector_encoder(folders):
    from bucketing_handler import BucketingHandler
    from tsctl.inprocess import ContinuousFrontend, LocalContext

    section = {
        "model_path": str(folders["colbert"]),
        "task": "multivector",
        "max_length": MAX_LENGTH,
        "cost": {"calibrate": False},
        "schedule": "continuous",
        "slice_ms": 1.0,  # a tiny slice: requests span several calls
    }
    context = LocalContext(section, model_name="tiny", model_config={"continuousBatching": True})
    handler = BucketingHandler()
    handler.initialize(context)
    texts = texts_for(seed=13)
    front = ContinuousFrontend(handler, context, batch_size=4)
    for i, t in enumerate(INPUT_TYPES):
        for j in range(0, len(texts), 3):
            front.submit(f"{i}-{j}", {"body": {"texts": texts[j : j + 3], **({"input_type": t} if t else {})}}, None)
    answers = front.drain()
    for i, t in enumerate(INPUT_TYPES):
        got = []
        for j in range(0, len(texts), 3):
            status, body, _ = answers[f"{i}-{j}"]
            assert status == 200, body
            got += [a["embeddings"] for a in json.loads(body)]
        assert mismatches(got, reference(folders["colbert"], texts, t)) == [], t


def test_a_worker_refuses_a_cap_one_text_cannot_fit(folders):
    from bucketing.config import ConfigError

    with pytest.raises(ConfigError, match="handler.max_response_bytes: got 2048; allowed: at least") as e:
        make_handler(folders["colbert"], task="multivector", max_length=MAX_LENGTH, max_response_bytes=2048)
    assert "\n" not in str(e.value)


def test_a_multi_vector_model_runs_in_float32_only(folders):
    from bucketing.model.head import EngineError

    with pytest.raises(EngineError, match="float32 only"):
        make_handler(folders["colbert"], task="multivector", max_length=MAX_LENGTH, dtype="bfloat16")


def test_truncate_false_names_the_length_of_the_input_type(folders, tmp_path):
    handler, context = handler_for(folders["colbert"], "torch", tmp_path)
    rows = [
        {"body": {"text": "x " * 20, "input_type": "query", "truncate": False}},
        {"body": {"text": "x " * 50, "input_type": "document", "truncate": False}},
        {"body": {"text": "x " * 50, "truncate": False}},
    ]
    (s1, a), (s2, b), (s3, c) = serve(handler, context, rows)
    assert (s1, s2, s3) == (413, 413, 200)
    assert "more than 16 tokens (the model's query length)" in a["message"]
    assert "more than 40 tokens (the model's document length)" in b["message"]
