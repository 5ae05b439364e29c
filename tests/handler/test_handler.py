"""The handler behind a fake TorchServe context: outputs independent of batching, per-request errors, metrics."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from bucketing.config import ConfigError
from bucketing.engines.torch_engine import TorchEngine
from bucketing_handler import BucketingHandler
from tsctl.inprocess import LocalContext

STRATEGIES = ["bucketed", "dynamic", "static"]
WORDS = "the a model server batch token short long text padding request answer worker queue length".split()


def mixed_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.choice([1, 3, 8, 30, 90]))) for _ in range(n)]


def serve_at(handler, context, rows, paths):
    """Rows sent to their url_paths (what follows /predictions/NAME/VERSION/; "" the plain path)."""
    context.with_requests(["application/json"] * len(rows), paths)
    bodies = handler.handle([{"body": row} for row in rows], context)
    return [(context.status[i][0], json.loads(b)) for i, b in enumerate(bodies)]


def make_handler(model_dir, **section) -> tuple[BucketingHandler, LocalContext]:
    section = {"model_path": str(model_dir), "cost": {"calibrate": False}, **section}
    context = LocalContext(section, model_name="tiny")
    handler = BucketingHandler()
    handler.initialize(context)
    return handler, context


def count_forward_rows(monkeypatch, task_class) -> list[int]:
    """Each pass's row count from now on (`task_class.forward` wrapped), to check what a request ran."""
    ran: list[int] = []
    forward = task_class.forward

    def counted(self, rows):
        ran.append(len(rows.ids))
        return forward(self, rows)

    monkeypatch.setattr(task_class, "forward", counted)
    return ran


def serve(handler, context, rows, content_types=None):
    context.with_requests(content_types or ["application/json"] * len(rows))
    bodies = handler.handle(rows, context)
    assert len(bodies) == len(rows)
    return [(context.status[i][0], json.loads(b)) for i, b in enumerate(bodies)]


def alone(handler, context, text):
    ((status, body),) = serve(handler, context, [{"body": {"text": text}}])
    assert status == 200
    return body


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_tiny_embedding_matches_batch_of_one(tiny_embedder_dir, strategy):
    handler, context = make_handler(tiny_embedder_dir, strategy=strategy, max_length=128)
    texts = mixed_texts(12)
    reference = [np.array(alone(handler, context, t)["embedding"]) for t in texts]
    rows = [{"body": {"text": t}} for t in texts[:6]] + [{"body": {"texts": texts[6:]}}]
    answers = serve(handler, context, rows)
    got = [a["embedding"] for _, a in answers[:6]] + [a["embedding"] for a in answers[6][1]]
    for ref, emb in zip(reference, got, strict=True):
        assert np.max(np.abs(ref - np.array(emb))) <= 1e-5


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_minilm_embedding_matches_batch_of_one(minilm_dir, strategy):
    handler, context = make_handler(minilm_dir, strategy=strategy, max_length=256)
    texts = mixed_texts(10, seed=1)
    reference = [np.array(alone(handler, context, t)["embedding"]) for t in texts]
    answers = serve(handler, context, [{"body": {"text": t}} for t in texts])
    for ref, (status, answer) in zip(reference, answers, strict=True):
        assert status == 200
        assert len(answer["embedding"]) == 384
        assert np.linalg.norm(answer["embedding"]) == pytest.approx(1.0, abs=1e-5)
        assert np.max(np.abs(ref - np.array(answer["embedding"]))) <= 1e-5


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_classification_label_matches_batch_of_one(tiny_classifier_dir, strategy):
    handler, context = make_handler(tiny_classifier_dir, task="classification", strategy=strategy, max_length=128)
    texts = mixed_texts(10, seed=2)
    reference = [alone(handler, context, t) for t in texts]
    answers = serve(handler, context, [{"body": {"texts": texts}}])
    (status, answer) = answers[0]
    assert status == 200
    for ref, got in zip(reference, answer, strict=True):
        assert got["label"] == ref["label"] and got["label"] in ("negative", "neutral", "positive")
        assert sum(got["scores"].values()) == pytest.approx(1.0, abs=1e-5)
        for label, p in ref["scores"].items():
            assert got["scores"][label] == pytest.approx(p, abs=1e-5)


def test_bad_requests_get_their_own_4xx_and_neighbours_succeed(tiny_embedder_dir):
    handler, context = make_handler(tiny_embedder_dir, max_texts_per_request=3)
    rows = [
        {"body": {"text": "good one"}},
        {"body": b""},
        {"body": {"text": ""}},
        {"body": b'{"text": '},
        {"body": {"text": 42}},
        {"body": b"\xff\xfe\xfd"},
        {"body": {"texts": ["a", "b", "c", "d"]}},
        {"hello world": b""},
        {"body": b"plain text body"},
    ]
    types = [
        "application/json",
        None,
        "application/json",
        "application/json",
        "application/json",
        "text/plain",
        "application/json",
        "application/x-www-form-urlencoded",
        "text/plain",
    ]
    answers = serve(handler, context, rows, types)
    assert [s for s, _ in answers] == [200, 400, 400, 400, 400, 400, 413, 415, 200]
    assert [a.get("type") for s, a in answers if s != 200] == [
        "EmptyBody",
        "EmptyText",
        "InvalidJSON",
        "InvalidType",
        "InvalidEncoding",
        "TooManyTexts",
        "UnsupportedMediaType",
    ]
    assert all(context.content_types[i] == "application/json" for i in range(len(rows)))
    assert answers[0][1]["embedding"] == alone(handler, context, "good one")["embedding"]


def test_truncate_says_so_and_reject_answers_413(tiny_embedder_dir):
    long_text = " ".join(["word"] * 100)
    handler, context = make_handler(tiny_embedder_dir, max_length=16, max_batch_tokens=64)
    ((status, answer),) = serve(handler, context, [{"body": {"texts": ["short", long_text]}}])
    assert status == 200
    assert [a["truncated"] for a in answer] == [False, True] and answer[1]["tokens"] == 16

    handler, context = make_handler(tiny_embedder_dir, max_length=16, max_batch_tokens=64, on_overflow="reject")
    answers = serve(handler, context, [{"body": {"text": "fine"}}, {"body": {"texts": ["ok", long_text]}}])
    assert answers[0][0] == 200 and answers[0][1]["truncated"] is False
    assert answers[1][0] == 413 and answers[1][1]["type"] == "TextTooLong"
    assert "texts[1]" in answers[1][1]["message"] and "max_length=16" in answers[1][1]["message"]


def test_metrics_report_real_and_padded_tokens(tiny_embedder_dir):
    texts = mixed_texts(16, seed=3)
    padded = {}
    for strategy in STRATEGIES:
        handler, context = make_handler(tiny_embedder_dir, strategy=strategy, max_length=128)
        serve(handler, context, [{"body": {"text": t}} for t in texts] + [{"body": b""}])
        totals = context.metrics.totals()
        assert totals["bucket_batches_total"] == 1
        assert totals["bucket_requests_total"] == 17 and totals["bucket_rejected_total"] == 1
        assert totals["bucket_texts_total"] == 16
        assert totals["bucket_real_tokens_total"] <= totals["bucket_padded_tokens_total"]
        assert totals["bucket_forward_ms_total"] > 0
        padded[strategy] = totals["bucket_padded_tokens_total"]
        if strategy != "bucketed":
            assert totals["bucket_sub_batches_total"] == 1
    assert padded["bucketed"] < padded["dynamic"] < padded["static"]


def poison(handler, monkeypatch) -> None:
    """Make every forward pass holding the text "poison" raise."""
    bad = handler.tokenizer.encode(["poison"])[0].ids
    forward = handler.task.forward

    def flaky(rows):
        if any(tuple(row[: len(bad)]) == bad for row in rows.ids.tolist()):
            raise RuntimeError("boom")
        return forward(rows)

    monkeypatch.setattr(handler.task, "forward", flaky)


def test_a_failing_text_fails_alone(tiny_embedder_dir, monkeypatch):
    handler, context = make_handler(tiny_embedder_dir)
    poison(handler, monkeypatch)
    answers = serve(
        handler,
        context,
        [{"body": {"text": "fine"}}, {"body": {"text": "poison"}}, {"body": b"x"}],
        ["application/json", "application/json", "text/plain"],
    )
    assert [s for s, _ in answers] == [200, 500, 200]
    assert answers[1][1]["type"] == "InternalServerError"


def test_max_length_over_the_model_limit_is_refused(tiny_embedder_dir):
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        make_handler(tiny_embedder_dir, max_length=1024, max_batch_tokens=4096)


def test_calibration_fits_a_cost_model(tiny_embedder_dir):
    handler, _ = make_handler(tiny_embedder_dir, max_length=64, cost={"calibrate": True})
    assert handler.cost.per_token_us > 0 or handler.cost.per_token_sq_us > 0


def test_a_worker_given_a_sibling_s_cost_model_runs_no_calibration(tiny_embedder_dir, monkeypatch):
    """`worker.open(cost=...)` (a host's later workers of one model): the given cost model, no calibration passes,
    and the same answers as the worker that calibrated."""
    from bucketing import worker as worker_module
    from bucketing.config import HandlerConfig
    from bucketing.protocols.base import Meta

    config = HandlerConfig.from_yaml({"handler": {"model_path": str(tiny_embedder_dir), "max_length": 64}})
    first = worker_module.open(config, str(tiny_embedder_dir))
    ran = count_forward_rows(monkeypatch, type(first.task))
    monkeypatch.setattr(worker_module, "calibrated", lambda *a: pytest.fail("calibrated again"))
    second = worker_module.open(config, str(tiny_embedder_dir), cost=first.cost)
    assert second.cost is first.cost and second.pipeline.cost is first.cost
    assert ran == [1]  # the warm-up pass alone
    meta = [Meta(content_type="application/json", url_path="/predictions/tiny")]
    a, _ = first.serve([{"body": {"text": "one text"}}], meta, None, "tiny")
    b, _ = second.serve([{"body": {"text": "one text"}}], meta, None, "tiny")
    assert a[0] is not None and b[0] is not None and a[0].body == b[0].body


def test_kserve_v2_and_v1_in_one_batch_match_batch_of_one(tiny_embedder_dir):
    handler, context = make_handler(tiny_embedder_dir)
    texts = mixed_texts(5, seed=4)
    v2 = {"id": "q1", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": texts[:3]}]}
    rows = [{"body": v2}, {"body": {"instances": texts[3:]}}, {"body": {"text": texts[0]}}]
    answers = serve(handler, context, rows)
    assert [s for s, _ in answers] == [200, 200, 200]
    body = answers[0][1]
    assert body["id"] == "q1" and body["model_name"] == "tiny"
    emb = next(o for o in body["outputs"] if o["name"] == "embedding")
    dim = emb["shape"][1]
    assert emb["datatype"] == "FP32" and emb["shape"][0] == 3 and len(emb["data"]) == 3 * dim
    for i, text in enumerate(texts[:3]):
        ref = np.array(alone(handler, context, text)["embedding"])
        assert np.max(np.abs(np.array(emb["data"][i * dim : (i + 1) * dim]) - ref)) <= 1e-5
    predictions = answers[1][1]["predictions"]
    assert [len(p["embedding"]) for p in predictions] == [dim, dim]


@pytest.mark.parametrize("task", ["embedding", "classification"])
def test_torchscript_trace_matches_eager(tiny_embedder_dir, tiny_classifier_dir, task):
    model_dir = tiny_embedder_dir if task == "embedding" else tiny_classifier_dir
    traced, context = make_handler(model_dir, task=task, torchscript=True)
    eager, _ = make_handler(model_dir, task=task, torchscript=False)
    assert isinstance(traced.task.engine, TorchEngine) and isinstance(eager.task.engine, TorchEngine)
    assert traced.task.engine.traced is not None and eager.task.engine.traced is None
    texts = mixed_texts(9, seed=5)
    rows = [{"body": {"texts": texts}}]
    ((_, a),) = serve(traced, context, rows)
    ((_, b),) = serve(eager, context, rows)
    key = "embedding" if task == "embedding" else "scores"
    for x, y in zip(a, b, strict=True):
        left = np.array(x[key] if task == "embedding" else list(x[key].values()))
        right = np.array(y[key] if task == "embedding" else list(y[key].values()))
        assert np.max(np.abs(left - right)) <= 1e-5


def test_openai_kserve_and_native_requests_in_one_batch(tiny_embedder_dir):
    handler, context = make_handler(tiny_embedder_dir)
    texts = mixed_texts(4, seed=6)
    ids = list(handler.tokenizer.encode([texts[3]])[0].ids[1:-1])
    rows = [
        {"body": {"input": texts[:2], "model": "m", "encoding_format": "float"}},
        {"body": {"text": texts[2]}},
        {"body": {"input": [ids], "dimensions": 8}},
        {"body": b""},
        {"body": {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": [texts[3]]}]}},
    ]
    paths = ["v1/embeddings", "", "v1/embeddings", "v1/models", ""]
    context.with_requests(["application/json", "application/json", "application/json", None, "application/json"], paths)
    bodies = [json.loads(b) for b in handler.handle(rows, context)]
    assert [context.status[i][0] for i in range(5)] == [200] * 5
    ref = {t: np.array(alone(handler, context, t)["embedding"]) for t in texts}
    assert [d["index"] for d in bodies[0]["data"]] == [0, 1] and bodies[0]["model"] == "m"
    for text, item in zip(texts[:2], bodies[0]["data"], strict=True):
        assert np.max(np.abs(np.array(item["embedding"]) - ref[text])) <= 1e-5
    assert np.max(np.abs(np.array(bodies[1]["embedding"]) - ref[texts[2]])) <= 1e-5
    short = ref[texts[3]][:8] / np.linalg.norm(ref[texts[3]][:8])
    assert np.max(np.abs(np.array(bodies[2]["data"][0]["embedding"]) - short)) <= 1e-5
    assert bodies[3]["data"][0]["id"] == "tiny"
    assert np.max(np.abs(np.array(bodies[4]["outputs"][0]["data"]) - ref[texts[3]])) <= 1e-5


def test_a_tokenizer_fault_fails_its_request_alone_and_is_counted(tiny_embedder_dir, monkeypatch):
    handler, context = make_handler(tiny_embedder_dir)
    encode = handler.tokenizer.encode

    def flaky(texts, left=False):
        if any("poison" in t for t in texts):
            raise RuntimeError("tokenizer fault")
        return encode(texts, left)

    monkeypatch.setattr(handler.tokenizer, "encode", flaky)
    answers = serve(handler, context, [{"body": {"text": "fine"}}, {"body": {"text": "poison"}}, {"body": b""}])
    assert [s for s, _ in answers] == [200, 500, 400]
    totals = context.metrics.totals()
    assert totals["bucket_requests_total"] == 3 and totals["bucket_failed_total"] == 1
    assert totals["bucket_rejected_total"] == 1 and totals["bucket_texts_total"] == 1


def test_one_by_one_retries_are_counted(tiny_embedder_dir, monkeypatch):
    handler, context = make_handler(tiny_embedder_dir)
    forward = handler.task.forward
    monkeypatch.setattr(
        handler.task,
        "forward",
        lambda rows: (_ for _ in ()).throw(RuntimeError("x")) if rows.ids.shape[0] > 1 else forward(rows),
    )
    answers = serve(handler, context, [{"body": {"text": "one"}}, {"body": {"texts": ["two", "three words here"]}}])
    assert [s for s, _ in answers] == [200, 500]
    totals = context.metrics.totals()
    assert totals["bucket_texts_total"] == 1 and totals["bucket_sub_batches_total"] == 1
    assert totals["bucket_failed_total"] == 1 and totals["bucket_batches_total"] == 1


def test_invisible_text_is_empty(tiny_embedder_dir):
    handler, context = make_handler(tiny_embedder_dir)
    answers = serve(handler, context, [{"body": {"texts": ["ok", "\u200b\u200b\x00"]}}, {"body": {"text": "fine"}}])
    assert answers[0][0] == 400 and answers[0][1]["type"] == "EmptyText" and "texts[1]" in answers[0][1]["message"]
    assert answers[1][0] == 200


def test_max_texts_per_request_must_fit_the_response_cap(tiny_embedder_dir, minilm_dir):
    make_handler(tiny_embedder_dir, max_texts_per_request=4096)  # 32 dimensions: 4096 answers fit
    make_handler(minilm_dir)  # the defaults: 2048 answers of 384 floats fit the default cap
    with pytest.raises(ConfigError, match="max_response_bytes"):
        make_handler(minilm_dir, max_texts_per_request=2048, max_response_bytes=6553500)  # TorchServe's old default
    with pytest.raises(ConfigError, match=r"at most \d+ for this model"):
        make_handler(tiny_embedder_dir, max_texts_per_request=64, max_response_bytes=65536)


def test_padding_rounded_past_the_model_positions_is_refused(tiny_embedder_dir):
    with pytest.raises(ConfigError, match=r"pad_to_multiple_of: got 384 with handler.max_length 512.*768"):
        make_handler(tiny_embedder_dir, max_length=512, pad_to_multiple_of=384, max_batch_tokens=8192)
    make_handler(tiny_embedder_dir, max_length=512, pad_to_multiple_of=384, max_batch_tokens=8192, strategy="static")
    make_handler(tiny_embedder_dir, max_length=512, pad_to_multiple_of=64, max_batch_tokens=8192)


def logits_of(model_dir, texts):
    """The classifier's logits from transformers itself, one text at a time."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return [model(**tok(t, return_tensors="pt")).logits[0].numpy() for t in texts]


def test_a_one_label_model_answers_its_sigmoid_score_or_raw_logit(tmp_path):
    from tests.models import build_tiny_bert

    folder = build_tiny_bert(tmp_path / "one", classifier=True, labels={0: "LABEL_0"})
    handler, context = make_handler(folder, task="classification")
    texts = mixed_texts(6, seed=3)
    logits = logits_of(folder, texts)
    (status, scored), (_, raw) = serve(
        handler, context, [{"body": {"texts": texts}}, {"body": {"texts": texts, "raw_scores": True}}]
    )
    assert status == 200 and set(scored[0]) == {"score", "tokens", "truncated"}
    for logit, s, r in zip(logits, scored, raw, strict=True):
        assert s["score"] == pytest.approx(1 / (1 + np.exp(-logit[0])), abs=1e-5)
        assert r["score"] == pytest.approx(float(logit[0]), abs=1e-5)
    assert len({round(s["score"], 6) for s in scored}) > 1  # not one constant answer for every input


def test_a_multi_label_model_gets_a_sigmoid_per_label(tmp_path):
    from tests.models import build_tiny_bert

    folder = build_tiny_bert(tmp_path / "multi", classifier=True, problem_type="multi_label_classification")
    handler, context = make_handler(folder, task="classification")
    texts = mixed_texts(4, seed=4)
    ((status, answers),) = serve(handler, context, [{"body": {"texts": texts}}])
    for logit, got in zip(logits_of(folder, texts), answers, strict=True):
        expected = 1 / (1 + np.exp(-logit))
        assert list(got["scores"]) == ["negative", "neutral", "positive"]
        assert np.max(np.abs(np.array(list(got["scores"].values())) - expected)) <= 1e-5


def test_duplicate_label_names_are_refused_at_build_and_at_start(tmp_path):
    from model_store import archives
    from tests.models import build_tiny_bert

    folder = build_tiny_bert(tmp_path / "dup", classifier=True, labels={0: "yes", 1: "no", 2: "yes"})
    with pytest.raises(archives.ModelFolderError, match="id2label names 'yes' for more than one class; give every"):
        archives.check_model_dir(folder, "classification")
    with pytest.raises(Exception, match="id2label names 'yes' for more than one class"):
        make_handler(folder, task="classification")


def test_raw_scores_must_be_a_boolean(tiny_classifier_dir):
    handler, context = make_handler(tiny_classifier_dir, task="classification")
    ((status, body),) = serve(handler, context, [{"body": {"text": "x", "raw_scores": "yes"}}])
    assert status == 400 and body["message"] == '"raw_scores" must be true or false, got string'
