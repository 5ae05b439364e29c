"""`handler.schedule: continuous` in process, under a stand-in for TorchServe's ContinuousBatching aggregator:
every request gets the answer `batch` gives it, in every wire format; a pending request gets nothing a client could
see; 4xx come at once; a model failure later is the request's own 500; nothing hangs."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from bucketing.config import ConfigError
from bucketing_handler import BucketingHandler
from tests.handler.test_handler import make_handler, poison
from tsctl.inprocess import ContinuousFrontend, LocalContext

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()


def text(n: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


def continuous(model_dir, **section):
    section = {"model_path": str(model_dir), "cost": {"calibrate": False}, "schedule": "continuous", **section}
    context = LocalContext(section, model_name="tiny", model_config={"continuousBatching": True})
    handler = BucketingHandler()
    handler.initialize(context)
    return handler, context


ROWS = [
    ({"body": {"text": text(3)}}, "application/json"),
    ({"body": {"texts": [text(90), text(5), text(40)]}}, "application/json"),
    ({"body": {"input": [text(60), text(2)], "model": "tiny"}}, "application/json"),
    ({"body": {"inputs": [{"name": "t", "shape": [2], "datatype": "BYTES", "data": [text(7), text(100)]}]}}, None),
    ({"body": {"instances": [text(30)]}}, "application/json"),
    ({"body": b"plain words here"}, "text/plain"),
]
PATHS = {2: "v1/embeddings"}  # what follows /predictions/NAME/VERSION/; KServe bodies are told by their shape


def vectors(body):
    """Every number of an answer, in order (the formats differ; the numbers must not)."""
    out = []

    def walk(x):
        if isinstance(x, bool):
            return
        if isinstance(x, (int, float)):
            out.append(float(x))
        elif isinstance(x, dict):
            for k in sorted(x):
                if k not in ("usage", "model", "id", "created"):
                    walk(x[k])
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(body)
    return np.array(out)


@pytest.fixture
def frontend_rows():
    return [(f"r{i}", row, ct, PATHS.get(i, "")) for i, (row, ct) in enumerate(ROWS)]


def run_batch(model_dir, rows):
    handler, context = make_handler(model_dir)
    context.with_requests([ct for _, _, ct, _ in rows], [p for *_, p in rows])
    bodies = handler.handle([row for _, row, _, _ in rows], context)
    return {key: (context.status[i][0], json.loads(bodies[i])) for i, (key, *_) in enumerate(rows)}


def test_every_door_gets_the_batch_answer(tiny_embedder_dir, frontend_rows):
    expected = run_batch(tiny_embedder_dir, frontend_rows)
    handler, context = continuous(tiny_embedder_dir, slice_ms=1.0)  # a tiny slice: requests span several calls
    front = ContinuousFrontend(handler, context, batch_size=4)
    for key, row, ct, path in frontend_rows:
        front.submit(key, row, ct, path)
    answers = front.drain()
    assert len(front.calls) > 2  # the pool did span calls
    for key, (status, body) in expected.items():
        got_status, got_body, _ = answers[key]
        assert got_status == status == 200, (key, got_body)
        got = json.loads(got_body)
        assert type(got) is type(body) and (not isinstance(got, dict) or set(got) == set(body))
        np.testing.assert_allclose(vectors(got), vectors(body), atol=1e-5)


def test_continuous_in_bfloat16_answers_every_door_as_float32_within_its_cosine(
    tiny_embedder_dir, frontend_rows, bf16_cpu
):
    expected = run_batch(tiny_embedder_dir, frontend_rows)  # float32, one batch
    handler, context = continuous(tiny_embedder_dir, slice_ms=1.0, dtype="bfloat16")
    front = ContinuousFrontend(handler, context, batch_size=4)
    for key, row, ct, path in frontend_rows:
        front.submit(key, row, ct, path)
    answers = front.drain()
    assert len(front.calls) > 2 and handler.task.engine.fidelity is not None
    for key, (status, body) in expected.items():
        got_status, got_body, _ = answers[key]
        got = vectors(json.loads(got_body))
        want = vectors(body)
        assert got_status == status == 200 and got.shape == want.shape, key
        np.testing.assert_allclose(got, want, atol=10 * handler.task.engine.fidelity.max_abs_diff)


def test_a_pending_request_gets_nothing_until_it_is_done(tiny_embedder_dir):
    handler, context = continuous(tiny_embedder_dir, slice_ms=1.0)
    front = ContinuousFrontend(handler, context, batch_size=8)
    front.submit("long", {"body": {"texts": [text(100)] * 6}})
    answered = front.step()
    assert answered == [] and context.request_ids == {} and context.status == {}
    front.submit("short", {"body": {"text": "hi"}})
    assert front.step() == ["short"]  # the short one overtakes, answered in its first call
    front.drain()
    assert front.answers["long"][0] == 200 and len(json.loads(front.answers["long"][1])) == 6


def test_a_bad_request_is_answered_in_its_first_call(tiny_embedder_dir):
    handler, context = continuous(tiny_embedder_dir, slice_ms=1.0)
    front = ContinuousFrontend(handler, context, batch_size=8)
    front.submit("long", {"body": {"texts": [text(100)] * 6}})
    front.submit("bad", {"body": {"texts": []}})
    assert front.step() == ["bad"]
    assert front.answers["bad"][0] == 400


def test_a_model_failure_on_a_pending_request_is_its_own_500(tiny_embedder_dir, monkeypatch):
    handler, context = continuous(tiny_embedder_dir, slice_ms=1.0)
    poison(handler, monkeypatch)
    front = ContinuousFrontend(handler, context, batch_size=8)
    front.submit("sick", {"body": {"texts": [text(100), text(100), "poison"]}})
    front.submit("well", {"body": {"texts": [text(100), text(100)]}})
    assert front.step() == []  # nothing is answered before its texts are all run
    answers = front.drain()
    assert answers["sick"][0] == 500 and json.loads(answers["sick"][1])["type"] == "InternalServerError"
    assert answers["well"][0] == 200


def test_a_request_torchserve_drops_is_forgotten(tiny_embedder_dir):
    handler, context = continuous(tiny_embedder_dir, slice_ms=1.0)
    front = ContinuousFrontend(handler, context, batch_size=8)
    front.submit("gone", {"body": {"texts": [text(100)] * 6}})
    front.step()
    assert "gone" in handler.pool.entries
    front._batch.clear()  # its client went away: TorchServe stops sending it
    front.submit("next", {"body": {"text": "hi"}})
    assert front.step() == ["next"] and handler.pool.entries == {}


def test_continuous_without_torchserve_continuous_batching_is_refused(tiny_embedder_dir):
    with pytest.raises(ConfigError, match="continuousBatching: true"):
        make_handler(tiny_embedder_dir, schedule="continuous")


def test_a_call_with_no_new_request_runs_up_to_max_wait_ms(tiny_embedder_dir):
    """One worker a model (refused otherwise): TorchServe calls it again at once while anything is pending, so a
    call that brought nothing new runs a bounded share of the pool (up to max_wait_ms of passes), not all of it."""
    handler, context = continuous(tiny_embedder_dir, slice_ms=1.0, max_wait_ms=1.0)
    front = ContinuousFrontend(handler, context, batch_size=8)
    front.submit("long", {"body": {"texts": [text(100)] * 6}})
    assert front.step() == []  # new: a slice only
    assert front.step() == []  # nothing new came: a bounded slice again
    assert front.drain()["long"][0] == 200 and len(front.calls) > 3


def test_a_bulk_request_cut_across_calls_yields_to_new_requests(tiny_embedder_dir):
    """A request's wait counts from the last call that ran any of its texts: a bulk request served call after call
    for longer than max_wait_ms does not go before a new short request."""
    handler, context = continuous(tiny_embedder_dir, slice_ms=1.0, max_wait_ms=200.0)
    front = ContinuousFrontend(handler, context, batch_size=8)
    front.submit("bulk", {"body": {"texts": [text(100)] * 2000}})
    start = time.monotonic()
    while time.monotonic() - start < 0.4:  # past max_wait_ms since it arrived, running all along
        assert front.step() == []
    front.submit("short", {"body": {"text": "hi"}})
    assert front.step() == ["short"]
    assert front.drain()["bulk"][0] == 200


def test_continuous_with_more_than_one_worker_is_refused(tiny_embedder_dir):
    section = {"model_path": str(tiny_embedder_dir), "cost": {"calibrate": False}, "schedule": "continuous"}
    context = LocalContext(section, model_config={"continuousBatching": True, "maxWorkers": 2})
    with pytest.raises(ConfigError, match="one worker per model"):
        BucketingHandler().initialize(context)


def test_rerank_routes_span_calls_and_rank_as_cross_encoder_ranks(tmp_path):
    from tests.handler.test_cross_encoder import MAX_LENGTH, QUERY, cross_encoder, documents, ranked_as_expected
    from tests.models import build_cross_encoder

    folder = build_cross_encoder(tmp_path / "ce", "bert", 1)
    docs = documents(12, seed=12)
    expected = {r["corpus_id"]: r["score"] for r in cross_encoder(folder).rank(QUERY, docs)}
    scores = [expected[i] for i in range(len(docs))]
    handler, context = continuous(folder, task="classification", max_length=MAX_LENGTH, slice_ms=1.0)
    front = ContinuousFrontend(handler, context, batch_size=4)
    front.submit("tei", {"body": {"query": QUERY, "texts": docs}}, url_path="rerank")
    front.submit("cohere", {"body": {"query": QUERY, "documents": docs, "top_n": 5}}, url_path="v1/rerank")
    answers = front.drain()
    assert len(front.calls) > 1 and answers["tei"][0] == answers["cohere"][0] == 200
    ranked_as_expected(json.loads(answers["tei"][1]), scores, "score", len(docs))
    ranked_as_expected(json.loads(answers["cohere"][1])["results"], scores, "relevance_score", 5)
