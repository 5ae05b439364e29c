"""Overload, a killed worker, hostile input, and the KServe config: a correct answer or a clear error, never a hang.

Every load here is bounded in count and time and targets 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import yaml

from model_store.archives import ROOT
from tsctl import Endpoints, TorchServe, free_ports, request

pytestmark = pytest.mark.e2e

POOL = [" ".join(["word"] * n) + f" item {n}" for n in (1, 3, 7, 15, 40, 90, 150)]


async def fire(
    url: str,
    headers: dict[str, str],
    bodies: Sequence[tuple[bytes, str | None]],
    concurrency: int,
    timeout_s: float = 60.0,
) -> list[tuple[int, bytes, float]]:
    """Send every body once with `concurrency` in flight; (status, body, seconds) each, status 0 on a timeout."""
    sem = asyncio.Semaphore(concurrency)
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:

        async def one(body: bytes, ctype: str | None) -> tuple[int, bytes, float]:
            async with sem:
                start = time.perf_counter()
                h = {**headers, **({"Content-Type": ctype} if ctype else {})}
                try:
                    async with session.post(url, data=body, headers=h) as resp:
                        return resp.status, await resp.read(), time.perf_counter() - start
                except (asyncio.TimeoutError, aiohttp.ClientError):
                    return 0, b"", time.perf_counter() - start

        return await asyncio.gather(*(one(b, c) for b, c in bodies))


def check_answer(text: str, status: int, body: bytes, reference) -> None:
    assert status == 200, body[:200]
    assert np.max(np.abs(np.array(json.loads(body)["embedding"]) - reference(text))) <= 1e-5


def load_and_kill(url, headers, texts, pid: int, concurrency: int, reference) -> tuple[list, float]:
    """Send the texts, SIGKILL the worker 0.7 s in; every request must end answered right or with a 5xx, none
    hanging. The replies, and when the kill was sent."""

    async def run():
        bodies = [(t.encode(), "text/plain") for t in texts]
        task = asyncio.create_task(fire(url, headers, bodies, concurrency, timeout_s=60))
        await asyncio.sleep(0.7)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.perf_counter()
        return await task, killed_at

    replies, killed_at = asyncio.run(run())
    statuses = [s for s, _, _ in replies]
    assert 0 not in statuses, "a request hung past the client timeout"
    assert all(s == 200 or 500 <= s < 600 for s in statuses), sorted(set(statuses))
    for text, (status, body, _) in zip(texts, replies, strict=True):
        if status == 200:
            check_answer(text, status, body, reference)
    return replies, killed_at


def worker_pids(client, model: str) -> list[int]:
    reply = client.call("management", "GET", f"/models/{model}")
    return sorted(w["pid"] for w in reply.json()[0]["workers"] if w.get("status") == "READY")


@pytest.fixture(scope="module")
def tight(tmp_path_factory, model_store):
    """A TorchServe whose queue holds 8 requests, with one worker: easy to push past capacity."""
    server = TorchServe(
        tmp_path_factory.mktemp("tight"),
        Endpoints.on_ports(*free_ports(3)),
        model_store=model_store,
        extra_properties={"job_queue_size": "8"},
    )
    server.start()
    try:
        server.client.register(
            "minilm-bucketed.mar", "tight", batch_size=4, max_batch_delay=10, workers=1, response_timeout=20
        )
        yield server
    finally:
        server.stop()


def sequential_latencies(server, n: int = 8) -> list[float]:
    out = []
    for i in range(n):
        start = time.perf_counter()
        reply = server.client.predict("tight", POOL[i % 3], "text/plain")
        assert reply.status == 200
        out.append(time.perf_counter() - start)
    return out


def test_overload_gets_answers_or_503_and_recovers(tight, reference):
    baseline = sorted(sequential_latencies(tight))[4]
    pids = worker_pids(tight.client, "tight")
    rng = random.Random(5)
    texts = [rng.choice(POOL) for _ in range(300)]
    url = f"{tight.endpoints.inference}/predictions/tight"
    headers = tight.client.keys.headers("inference")
    start = time.perf_counter()
    replies = asyncio.run(fire(url, headers, [(t.encode(), "text/plain") for t in texts], concurrency=150))
    burst_s = time.perf_counter() - start
    statuses = [s for s, _, _ in replies]
    assert set(statuses) <= {200, 503}, sorted(set(statuses))
    assert statuses.count(503) > 0, "the burst never filled the queue"
    for text, (status, body, _) in zip(texts, replies, strict=True):
        if status == 200:
            check_answer(text, status, body, reference)
    rejected_ms = sorted(1000 * s for status, _, s in replies if status == 503)
    recovery_start = time.perf_counter()
    after = sequential_latencies(tight)
    recovery_s = time.perf_counter() - recovery_start
    print(
        f"\noverload: 300 requests, 150 in flight, queue 8, 1 worker, in {burst_s:.1f} s: "
        f"{statuses.count(200)} x 200, {statuses.count(503)} x 503 "
        f"(median {rejected_ms[len(rejected_ms) // 2]:.0f} ms), "
        f"0 wrong; p50 before {1000 * baseline:.0f} ms, after {1000 * sorted(after)[4]:.0f} ms; "
        f"8 sequential requests after the burst took {recovery_s:.2f} s"
    )
    assert worker_pids(tight.client, "tight") == pids, "a worker restarted under overload"


def test_killed_worker_is_replaced_and_nothing_hangs(tight, reference):
    (pid,) = worker_pids(tight.client, "tight")
    rng = random.Random(6)
    texts = [rng.choice(POOL) for _ in range(150)]
    url = f"{tight.endpoints.inference}/predictions/tight"
    headers = tight.client.keys.headers("inference")

    replies, killed_at = load_and_kill(url, headers, texts, pid, 6, reference)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        new = worker_pids(tight.client, "tight")
        if new and new != [pid]:
            break
        time.sleep(0.2)
    recovered_s = time.perf_counter() - killed_at
    assert new and new != [pid], "TorchServe did not restart the worker"
    for text in POOL:
        reply = tight.client.predict("tight", text, "text/plain")
        check_answer(text, reply.status, reply.body, reference)
    print(
        f"\nworker kill: of 150 requests {dict(sorted(Counter(s for s, _, _ in replies).items()))}, "
        f"0 wrong, 0 hung; new worker READY {recovered_s:.1f} s after the kill"
    )


def malformed_bodies(n: int, seed: int) -> list[tuple[bytes, str | None]]:
    """Client mistakes of many kinds (and some random bytes that may happen to be a valid text)."""
    rng = random.Random(seed)
    fixed = [
        (b"", "application/json"),
        (b"", None),
        (b"{", "application/json"),
        (b"[]", "application/json"),
        (b"null", "application/json"),
        (b"42", "application/json"),
        (b'"just a string"', "application/json"),
        (b'{"text": null}', "application/json"),
        (b'{"texts": {}}', "application/json"),
        (b'{"texts": [""]}', "application/json"),
        (b'{"text": "\\ud800"}', "application/json"),
        (b"[" * 50000 + b"]" * 50000, "application/json"),
        (b'{"a":' * 3000 + b"1" + b"}" * 3000, "application/json"),
        (json.dumps({"texts": ["x"] * 500}).encode(), "application/json"),
        (b"text=hello", None),
        (b"\xc3\x28", "text/plain"),
        (b"\xed\xa0\x80", "text/plain"),
        (b"\x00\x00", "text/plain"),
        (json.dumps({"inputs": [{"datatype": "BYTES", "shape": [2], "data": ["a"]}]}).encode(), "application/json"),
        (json.dumps({"inputs": "x"}).encode(), "application/json"),
        (json.dumps({"instances": [1, 2]}).encode(), "application/json"),
        (b'{"text": "ok", "extra": 1}', "application/json; charset=utf-8"),
    ]
    out = list(fixed)
    types = ["application/json", "text/plain", None, "application/octet-stream", "application/x-www-form-urlencoded"]
    while len(out) < n:
        kind = rng.random()
        if kind < 0.4:
            body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        elif kind < 0.7:
            value: object = rng.choice(
                [
                    None,
                    True,
                    1.5,
                    [],
                    {},
                    {"text": rng.randint(0, 9)},
                    {"texts": [None]},
                    {"texts": "abc"},
                    {"text": ""},
                    {"txt": "a"},
                ]
            )
            body = json.dumps(value).encode()
        else:
            body = json.dumps({"texts": [rng.choice(["a", "", 3, None])] * rng.randint(0, 40)}).encode()
        out.append((body, rng.choice(types)))
    return out[:n]


def test_hostile_input_gets_4xx_without_restarts_and_neighbours_are_answered(torchserve, shared_models, reference):
    """On the shared `bucketed` model (two workers, batch_size 8): each malformed body is its caller's 4xx, the good
    ones beside them in the same batches are answered right, and no worker restarts."""
    client = torchserve.client
    name = shared_models("bucketed")
    pids = worker_pids(client, name)
    assert len(pids) == 2
    bad = malformed_bodies(300, seed=9)
    good = [(t.encode(), "text/plain") for t in POOL * 6]
    calls = [(b, c, False) for b, c in bad] + [(b, c, True) for b, c in good]
    random.Random(2).shuffle(calls)
    url = f"{torchserve.endpoints.inference}/predictions/{name}"
    replies = asyncio.run(fire(url, client.keys.headers("inference"), [(b, c) for b, c, _ in calls], 32))
    statuses: dict[int, int] = {}
    for (body, _, is_good), (status, answer, _) in zip(calls, replies, strict=True):
        if is_good:
            check_answer(body.decode(), status, answer, reference)
        else:
            assert 0 < status < 500, (body[:80], status, answer[:200])
            statuses[status] = statuses.get(status, 0) + 1
    print(f"\nhostile: 300 malformed requests with 42 good ones: {dict(sorted(statuses.items()))}")
    assert worker_pids(client, name) == pids, "a worker restarted"


def test_registration_only_from_the_model_store(torchserve):
    reply = torchserve.client.call("management", "POST", "/models?url=http://127.0.0.1:9/x.mar")
    assert 400 <= reply.status < 500 and "allowed" in reply.text


def test_expired_or_rotated_keys_are_renewed(torchserve, shared_models):
    client = torchserve.client
    name = shared_models("bucketed")  # any model answers: the keys are the server's
    old = client.keys.key("inference")
    assert client.ensure_fresh(margin_s=10 * 3600)  # as if the key were about to expire
    assert client.keys.key("inference") != old
    url = f"{torchserve.endpoints.inference}/predictions/{name}"
    assert request(url, "POST", "x", {"Authorization": f"Bearer {old}", "Content-Type": "text/plain"}).status == 400
    client.keys._keys["inference"]["key"] = old  # a client holding a stale key: refused once, renewed, answered
    assert client.predict(name, "hello", "text/plain").status == 200


# What KServe's kserve-torchserve runtime puts in the pod's environment (TS_SERVICE_ENVELOPE, kservev2 for
# protocolVersion v2), and TS_* settings that would visibly break the pod if TorchServe honoured them.
RUNTIME_ENV = {
    "TS_SERVICE_ENVELOPE": "kservev2",
    "TS_JOB_QUEUE_SIZE": "1",
    "TS_INFERENCE_ADDRESS": "http://127.0.0.1:9",
    "TS_DEFAULT_RESPONSE_TIMEOUT": "1",
}


def test_kserve_manifest_and_config(model_store, reference, tmp_path, monkeypatch):
    docs = list(yaml.safe_load_all((ROOT / "config" / "kserve" / "inferenceservice.yaml").read_text()))
    isvc = next(d for d in docs if d["kind"] == "InferenceService")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["metadata"]["name"]
    predictor = isvc["spec"]["predictor"]
    model = predictor["model"]
    assert model["runtime"] == "bucketing-torchserve" and model["protocolVersion"] == "v2"
    assert model["storageUri"] and predictor["minReplicas"] >= 2 and predictor["maxReplicas"] > predictor["minReplicas"]
    assert predictor["scaleMetric"] in ("concurrency", "rps", "cpu") and predictor["scaleTarget"] > 0

    props = Path(ROOT / "config" / "kserve" / "config.properties")
    for name, value in RUNTIME_ENV.items():  # as the pod sets them: the config must be immune to them
        monkeypatch.setenv(name, value)
    server = TorchServe(
        tmp_path / "kserve", Endpoints.on_ports(*free_ports(3)), model_store=model_store, base_properties=props
    )
    assert 'batchSize":16' in server.properties["model_snapshot"].replace(" ", "")
    with server:
        server.client.wait_ready("minilm", 2, 180)
        url = f"{server.endpoints.inference}/v2/models/minilm/infer"
        groups = [POOL[i : i + 2] for i in range(0, 6)]
        tensors = [{"name": "text", "datatype": "BYTES", "shape": [2], "data": g} for g in groups]
        bodies = [
            (json.dumps({"id": str(i), "inputs": [t]}).encode(), "application/json") for i, t in enumerate(tensors)
        ]
        bodies *= 3
        replies = asyncio.run(fire(url, server.client.keys.headers("inference"), bodies, 18))
        for i, (status, body, _) in enumerate(replies):
            assert status == 200, body[:200]
            out = json.loads(body)["outputs"][0]
            vectors = np.array(out["data"]).reshape(out["shape"])
            for text, vector in zip(groups[i % 6], vectors, strict=True):
                assert np.max(np.abs(vector - reference(text))) <= 1e-5
