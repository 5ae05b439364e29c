"""End to end on a real TorchServe: concurrent mixed-length load, bad requests beside good ones, metrics, auth."""

from __future__ import annotations

import dataclasses
import json
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bench.harness.stats import parse_prometheus
from tests.e2e.conftest import SHARED
from tsctl import request

pytestmark = pytest.mark.e2e

WORDS = (
    "serving transformer models in production means handling short queries and long passages in the same "
    "traffic while keeping latency low and throughput high on modest hardware with careful batching"
).split()


def texts_for_load(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lengths = [rng.choice([2, 4, 6, 10, 40, 120, 180]) for _ in range(n)]
    return [" ".join(rng.choice(WORDS) for _ in range(k)) for k in lengths]


@pytest.fixture(scope="module")
def models(torchserve, shared_models):
    """`bucketed` (shared with other modules) and `dynamic`, registered alike (batch_size 8, max_batch_delay 50, two
    workers): their counters are compared."""
    shared_models("bucketed")
    dynamic = dataclasses.replace(SHARED["bucketed"], archive="minilm-dynamic.mar")
    dynamic.register(torchserve, "dynamic")
    try:
        yield torchserve
    finally:
        torchserve.client.unregister("dynamic")


BAD = [
    (b"", "application/json", 400, "EmptyBody"),
    (b'{"text": ""}', "application/json", 400, "EmptyText"),
    (b'{"text": "unterminated', "application/json", 400, "InvalidJSON"),
    (b'{"texts": [1, 2]}', "application/json", 400, "InvalidType"),
    (b"\xff\xfe\xfa", "text/plain", 400, "InvalidEncoding"),
    (json.dumps({"texts": ["x"] * 2049}).encode(), "application/json", 413, "TooManyTexts"),  # max_texts_per_request
    (b"hello world", "application/x-www-form-urlencoded", 415, "UnsupportedMediaType"),  # what curl -d sends
]


MODELS = ("bucketed", "dynamic")


def counter(metrics_text: str, name: str, model: str) -> float:
    return parse_prometheus(metrics_text, model)[name]


def figure(pattern: str, text: str) -> float:
    """The figure a metrics line matching `pattern` holds (its first group)."""
    found = re.search(pattern, text, re.M)
    assert found is not None, pattern
    return float(found.group(1))


def test_concurrent_mixed_load_with_bad_requests(models, reference):
    client = models.client
    texts = texts_for_load(48, seed=7)
    jobs = [("text", t) for t in texts[:40]] + [("texts", texts[40:44]), ("texts", texts[44:48])]
    names = [
        "bucket_batches_total",
        "bucket_requests_total",
        "bucket_real_tokens_total",
        "bucket_padded_tokens_total",
    ]
    before = client.metrics()
    for model in ("bucketed", "dynamic"):
        calls: list[tuple[bytes, str, tuple[object, object]]] = [
            (json.dumps({kind: value}).encode(), "application/json", (kind, value)) for kind, value in jobs
        ]
        calls += [(body, ctype, (status, kind)) for body, ctype, status, kind in BAD]
        random.Random(1).shuffle(calls)
        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            replies = list(pool.map(lambda c, m=model: (c, client.predict(m, c[0], c[1])), calls))
        good = 0
        for (_, _, expect), reply in replies:
            if isinstance(expect[0], int):
                status, kind = expect
                assert reply.status == status, reply.text
                assert reply.json()["type"] == kind
                continue
            assert reply.status == 200, reply.text
            kind, value = expect
            answers = [reply.json()] if kind == "text" else reply.json()
            sent = [value] if kind == "text" else value
            assert len(answers) == len(sent)
            for text, answer in zip(sent, answers, strict=True):
                assert np.max(np.abs(np.array(answer["embedding"]) - reference(text))) <= 1e-5
                good += 1
        assert good == 48
    after = client.metrics()
    delta = {
        (model, name): counter(after, name, model) - counter(before, name, model)
        for model in ("bucketed", "dynamic")
        for name in names
    }
    for model in ("bucketed", "dynamic"):
        requests = delta[model, "bucket_requests_total"]
        assert requests == len(jobs) + len(BAD)
        assert requests / delta[model, "bucket_batches_total"] > 1, "TorchServe delivered no batch larger than 1"
    efficiency = {
        m: delta[m, "bucket_real_tokens_total"] / delta[m, "bucket_padded_tokens_total"]
        for m in ("bucketed", "dynamic")
    }
    print(f"padding efficiency: {efficiency}")
    assert delta["bucketed", "bucket_real_tokens_total"] == delta["dynamic", "bucket_real_tokens_total"]
    assert delta["bucketed", "bucket_padded_tokens_total"] < delta["dynamic", "bucket_padded_tokens_total"]


def test_token_authorization_is_on_for_inference_and_management_not_metrics(models):
    url = f"{models.endpoints.inference}/predictions/bucketed"
    headers = {"Content-Type": "text/plain"}
    assert request(url, "POST", "hello", headers).status == 400
    assert request(url, "POST", "hello", {**headers, "Authorization": "Bearer wrong"}).status == 400
    assert models.client.predict("bucketed", "hello", "text/plain").status == 200
    assert request(f"{models.endpoints.management}/models").status == 400
    # TorchServe 0.12 checks no token on the metrics listener (docs/operations/security.md says so): that is why
    # every config we ship keeps it on loopback (tests/unit/test_config.py)
    assert request(f"{models.endpoints.metrics}/metrics").status == 200


def test_static_archive_serves_too(torchserve, reference):
    client = torchserve.client
    try:
        client.register("minilm-static.mar", "static", batch_size=4, max_batch_delay=20, workers=1)
        reply = client.predict("static", json.dumps({"texts": ["short one", "a somewhat longer text here"]}))
        assert reply.status == 200
        for text, answer in zip(["short one", "a somewhat longer text here"], reply.json(), strict=True):
            assert np.max(np.abs(np.array(answer["embedding"]) - reference(text))) <= 1e-5
    finally:
        client.unregister("static")


def test_kserve_v2_and_v1_with_batching(models, reference):
    """v2 at /v2/models/NAME/infer (BYTES inputs of several texts) and v1, concurrently, with batch_size 8."""
    client = models.client
    texts = texts_for_load(36, seed=11)
    groups = [texts[i : i + (1 + i % 3)] for i in range(0, 36, 3)]
    calls = [("v2", f"r{i}", g) for i, g in enumerate(groups)] + [("v1", None, g) for g in groups[:6]]
    before = counter(client.metrics(), "bucket_batches_total", "bucketed")

    def send(call):
        kind, rid, group = call
        if kind == "v2":
            body = {"id": rid, "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(group)], "data": group}]}
            path = "/v2/models/bucketed/infer"
        else:
            body, path = {"instances": group}, "/v1/models/bucketed:predict"
        return call, client.call(
            "inference", "POST", path, json.dumps(body), headers={"Content-Type": "application/json"}
        )

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        replies = list(pool.map(send, calls))
    for (kind, rid, group), reply in replies:
        assert reply.status == 200, reply.text
        body = reply.json()
        if kind == "v2":
            assert body["id"] == rid and body["model_name"] == "bucketed"
            emb = next(o for o in body["outputs"] if o["name"] == "embedding")
            assert emb["datatype"] == "FP32" and emb["shape"] == [len(group), 384]
            vectors = np.array(emb["data"]).reshape(len(group), 384)
        else:
            vectors = np.array([p["embedding"] for p in body["predictions"]])
        for text, vector in zip(group, vectors, strict=True):
            assert np.max(np.abs(vector - reference(text))) <= 1e-5
    batches = counter(client.metrics(), "bucket_batches_total", "bucketed") - before
    assert batches < len(calls), "TorchServe delivered no batch larger than 1"


def test_histograms_and_errors_by_type_reach_prometheus(models):
    """One good request and one empty body reach the histograms and the errors by type (read as deltas: the model
    is shared, its counters may start above 0)."""
    client = models.client
    errors = r'^bucket_errors_total{type="EmptyBody",status="400",ModelName="bucketed",[^}]*} (\S+)$'
    batches = r'^bucket_batch_size_count{ModelName="bucketed",[^}]*} (\S+)$'

    def read(pattern: str, text: str) -> float:
        found = re.search(pattern, text, re.M)
        return float(found.group(1)) if found else 0.0  # no line before the first

    before = client.metrics()
    for body, ctype in [(b'{"text": "histogram probe"}', "application/json"), (b"", "application/json")]:
        client.predict("bucketed", body, ctype)
    deadline = time.monotonic() + 10  # the frontend reads the workers' metric lines asynchronously
    while True:
        text = client.metrics()
        counted = read(errors, text) > read(errors, before) and read(batches, text) > read(batches, before)
        if counted or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert read(errors, text) == read(errors, before) + 1, "the empty body was not counted once as EmptyBody"
    assert read(batches, text) > read(batches, before), "the probe's batch reached no histogram"
    for name in ("bucket_batch_size", "bucket_pass_texts", "bucket_pass_padded_tokens", "bucket_request_ms"):
        assert re.search(rf'^{name}_bucket{{le="\+Inf",ModelName="bucketed",', text, re.M), name
        assert re.search(rf'^{name}_count{{ModelName="bucketed",', text, re.M), name
    count = figure(batches, text)
    inf = figure(r'^bucket_batch_size_bucket{le="\+Inf",ModelName="bucketed",[^}]*} (\S+)$', text)
    assert count == inf > 0


def test_bodies_are_decoded_once_through_torchserve(torchserve, shared_models, reference):
    """TorchServe's worker parses an application/json body itself: a JSON string is refused, never parsed again
    as an envelope; application/octet-stream is read as a body without a Content-Type (an envelope is JSON)."""
    name = shared_models("bucketed")
    client = torchserve.client
    for body, ctype in [(b'"hello"', "application/json"), (b'"{\\"text\\": \\"hello\\"}"', "application/json")]:
        reply = client.predict(name, body, ctype)
        assert reply.status == 400 and "got a JSON string" in reply.json()["message"], reply.text
    for untyped in ("application/octet-stream", None):
        reply = client.predict(name, b'{"text": "hello"}', untyped)
        assert reply.status == 200, reply.text
        assert np.max(np.abs(np.array(reply.json()["embedding"]) - reference("hello"))) <= 1e-5
