"""One protocol, two hosts: the same requests to TorchServe (the session's, the shared `batch` model) and to the
standalone server (`bucketing.hosts.standalone` on the same archive, under the same name and batching), answered
with the same status, content type and body bytes, errors included; then what only the standalone host does
(its root OpenAI routes, KServe's health routes, its limits, SIGTERM).

Requests go one at a time (each its own batch on either host), so an answer's floats come from the same passes."""

from __future__ import annotations

import json
import re
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tsctl import TorchServe, free_ports, request
from tsctl.standalone import Standalone

pytestmark = pytest.mark.e2e
NAME = "batch"  # tests/e2e/conftest.py SHARED["batch"]: minilm-bucketed.mar, batch 8, delay 100 ms, 1 worker
JSON = "application/json"
SHARED_BATCHING = ["--batch-size", "8", "--max-batch-delay", "100", "--workers", "1"]


@dataclass(frozen=True)
class Host:
    name: str
    url: str
    headers: dict[str, str]

    def call(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None):
        return request(self.url + path, method, body, {**self.headers, **(headers or {})}, timeout=120)


def start_standalone(workdir: Path, model_store: Path, *extra: str) -> Standalone:
    server = Standalone(workdir, free_ports(1)[0])
    archive = str(model_store / "minilm-bucketed.mar")
    return server.start(["--archive", archive, "--name", NAME, *SHARED_BATCHING], extra)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, model_store):
    server = start_standalone(tmp_path_factory.mktemp("standalone"), model_store)
    try:
        yield server
    finally:
        assert server.stop() == 0, server.tail()


@pytest.fixture(scope="module")
def hosts(torchserve: TorchServe, shared_models, standalone: Standalone) -> dict[str, Host]:
    shared_models(NAME)
    return {
        "torchserve": Host("torchserve", torchserve.endpoints.inference, torchserve.client.keys.headers("inference")),
        "standalone": Host("standalone", standalone.url, standalone.headers()),
    }


def v2_binary(texts: list[str]) -> tuple[bytes, dict[str, str]]:
    raw = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    tensor = {"name": "text", "datatype": "BYTES", "shape": [len(texts)], "parameters": {"binary_data_size": len(raw)}}
    head = json.dumps({"id": "b1", "inputs": [tensor]}).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}


def j(value) -> bytes:
    return json.dumps(value).encode()


BASE = f"/predictions/{NAME}/1.0"
V2 = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["short query", "a passage"]}]}
BINARY, BINARY_HEADERS = v2_binary(["short query", "caf\u00e9 au lait"])
LONG = "word " * 400
# (id, method, path, body, headers): every wire format, then the errors; the same bytes go to both hosts.
CASES = [
    ("text-plain", "POST", f"/predictions/{NAME}", b"hello world", {"Content-Type": "text/plain"}),
    ("native-text", "POST", f"/predictions/{NAME}", j({"text": "hello"}), {"Content-Type": JSON}),
    ("native-texts", "POST", BASE, j({"texts": ["a short one", "and another"]}), {"Content-Type": JSON}),
    ("native-charset", "POST", BASE, j({"text": "x"}), {"Content-Type": "application/json; charset=utf-8"}),
    ("native-untyped", "POST", BASE, j({"text": "sniffed"}), {}),
    ("native-binary", "POST", BASE, j({"text": "packed", "precision": "ubinary"}), {"Content-Type": JSON}),
    ("openai", "POST", f"{BASE}/v1/embeddings", j({"input": ["hello there"], "model": "m"}), {"Content-Type": JSON}),
    (
        "openai-base64",
        "POST",
        f"{BASE}/v1/embeddings",
        j({"input": "hi", "encoding_format": "base64", "dimensions": 64}),
        {"Content-Type": JSON},
    ),
    ("openai-models", "GET", f"{BASE}/v1/models", None, {}),
    ("kserve-v1", "POST", f"/v1/models/{NAME}:predict", j({"instances": ["hello"]}), {"Content-Type": JSON}),
    ("kserve-v2", "POST", f"/v2/models/{NAME}/infer", j(V2), {"Content-Type": JSON}),
    ("kserve-v2-binary", "POST", f"/v2/models/{NAME}/infer", BINARY, BINARY_HEADERS),
    ("tei-embed", "POST", f"{BASE}/embed", j({"inputs": "hello"}), {"Content-Type": JSON}),
    ("tei-plain-path", "POST", f"/predictions/{NAME}", j({"inputs": ["hello", "world"]}), {"Content-Type": JSON}),
    (
        "tei-similarity",
        "POST",
        f"{BASE}/similarity",
        j({"inputs": {"source_sentence": "a cat", "sentences": ["a dog", "a car"]}}),
        {"Content-Type": JSON},
    ),
    ("tei-tokenize", "POST", f"{BASE}/tokenize", j({"inputs": "hello world"}), {"Content-Type": JSON}),
    ("tei-decode", "POST", f"{BASE}/decode", j({"ids": [101, 7592, 102]}), {"Content-Type": JSON}),
    ("tei-info", "GET", f"{BASE}/info", None, {}),
    (
        "cohere-embed",
        "POST",
        f"{BASE}/v2/embed",
        j({"texts": ["hello"], "input_type": "search_query", "embedding_types": ["float", "binary"]}),
        {"Content-Type": JSON},
    ),
    # errors
    ("bad-json", "POST", BASE, b'{"text": ', {"Content-Type": JSON}),
    ("bad-json-sniffed", "POST", BASE, b'{"text":', {}),
    ("form-body", "POST", BASE, b"text=hello", {"Content-Type": "application/x-www-form-urlencoded"}),
    ("too-many-texts", "POST", BASE, j({"texts": ["a"] * 2049}), {"Content-Type": JSON}),
    ("unknown-prompt", "POST", BASE, j({"text": "a", "prompt_name": "nope"}), {"Content-Type": JSON}),
    ("too-long", "POST", BASE, j({"text": LONG, "truncate": False}), {"Content-Type": JSON}),
    ("unknown-field", "POST", BASE, j({"txt": "a"}), {"Content-Type": JSON}),
    ("empty-body", "POST", BASE, b"", {"Content-Type": JSON}),
    ("empty-text", "POST", BASE, j({"texts": ["a", " "]}), {"Content-Type": JSON}),
    ("not-utf8", "POST", BASE, b"\xff\xfe", {"Content-Type": "text/plain"}),
    ("json-string", "POST", BASE, b'"hello"', {"Content-Type": JSON}),
    ("not-served", "POST", f"{BASE}/nope", j({"text": "a"}), {"Content-Type": JSON}),
    ("openai-empty", "POST", f"{BASE}/v1/embeddings", j({"input": []}), {"Content-Type": JSON}),
    ("openai-dims", "POST", f"{BASE}/v1/embeddings", j({"input": "a", "dimensions": 999}), {"Content-Type": JSON}),
    ("v2-bad-shape", "POST", f"/v2/models/{NAME}/infer", j({"inputs": [{"shape": "x"}]}), {"Content-Type": JSON}),
    ("tei-too-many", "POST", f"{BASE}/embed", j({"inputs": ["a"] * 2049}), {"Content-Type": JSON}),
    ("tei-rerank-embedder", "POST", f"{BASE}/rerank", j({"query": "q", "texts": ["a"]}), {"Content-Type": JSON}),
    ("cohere-rerank", "POST", f"{BASE}/v1/rerank", j({"query": "q", "documents": ["a"]}), {"Content-Type": JSON}),
    ("unknown-model", "POST", "/predictions/nope", j({"text": "a"}), {"Content-Type": JSON}),
    ("unknown-version", "POST", f"/predictions/{NAME}/2.0", j({"text": "a"}), {"Content-Type": JSON}),
    ("v1-unknown-model", "POST", "/v1/models/nope:predict", j({"instances": ["a"]}), {"Content-Type": JSON}),
    ("ping", "GET", "/ping", None, {}),
]


def unique(body: bytes) -> bytes:
    """The body with what is new in every answer masked: Cohere's response `id` (a fresh UUID each time)."""
    return re.sub(rb'^\{"id":"[0-9a-f-]{36}"', b'{"id":"<uuid>"', body)


@pytest.mark.parametrize(("case", "method", "path", "body", "headers"), CASES, ids=[c[0] for c in CASES])
def test_both_hosts_answer_the_same_bytes(hosts, case, method, path, body, headers):
    got = {name: host.call(method, path, body, headers) for name, host in hosts.items()}
    ts, sa = got["torchserve"], got["standalone"]
    assert (sa.status, sa.headers.get("content-type"), unique(sa.body)) == (
        ts.status,
        ts.headers.get("content-type"),
        unique(ts.body),
    ), f"{case}: torchserve {ts.status} {ts.body[:300]!r}\nstandalone {sa.status} {sa.body[:300]!r}"
    length = "inference-header-content-length"  # KServe v2's binary answers: the JSON header's length
    assert sa.headers.get(length) == ts.headers.get(length)


@pytest.mark.parametrize("host_name", ["torchserve", "standalone"])
def test_each_host_refuses_a_missing_or_wrong_token(hosts, host_name):
    host = hosts[host_name]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        reply = request(host.url + BASE, "POST", j({"text": "a"}), {"Content-Type": JSON, **headers})
        # TorchServe 0.12 answers 400 (its InvalidKeyException); the standalone host 401, with the same words
        assert reply.status == (400 if host_name == "torchserve" else 401)
        assert reply.json()["type"] == "InvalidKeyException" and "Token Authorization failed" in reply.json()["message"]


ROOT_ALIASES = [
    ("/v1/embeddings", f"{BASE}/v1/embeddings", "POST", j({"input": ["hello"], "model": "m"})),
    ("/openai/v1/embeddings", f"{BASE}/v1/embeddings", "POST", j({"input": "hi", "model": "x", "dimensions": 8})),
    ("/openai/v1/rerank", f"{BASE}/v1/rerank", "POST", j({"query": "q", "documents": ["a"]})),
    ("/v1/models", f"{BASE}/v1/models", "GET", None),
]


@pytest.mark.parametrize(("root", "path", "method", "body"), ROOT_ALIASES, ids=[a[0] for a in ROOT_ALIASES])
def test_root_openai_routes_answer_as_the_model_path_on_torchserve(hosts, root, path, method, body):
    headers = {"Content-Type": JSON}
    sa = hosts["standalone"].call(method, root, body, headers)
    ts = hosts["torchserve"].call(method, path, body, headers)
    assert (sa.status, sa.body) == (ts.status, ts.body)


def test_kserve_health_and_metadata_routes(hosts):
    sa = hosts["standalone"]
    assert request(sa.url + "/v2/health/live").json() == {"live": True}  # probes: no token
    assert request(sa.url + "/v2/health/ready").json() == {"ready": True}
    assert sa.call("GET", f"/v2/models/{NAME}/ready").json() == {"name": NAME, "ready": True}
    assert sa.call("GET", f"/v1/models/{NAME}").json() == {"name": NAME, "ready": True}
    assert sa.call("GET", "/v2/models/nope/ready").status == 404
    metrics = sa.call("GET", "/metrics")
    assert metrics.status == 200 and f'bucket_requests_total{{ModelName="{NAME}"}}' in metrics.text
    assert request(sa.url + "/metrics").status == 401  # the metrics of a host on its inference port need the key


def test_a_body_over_the_limit_is_a_413(tmp_path, model_store):
    server = start_standalone(tmp_path, model_store, "--max-request-bytes", "1000", "--queue-size", "2")
    try:
        big = j({"text": "x" * 2000})
        reply = request(server.url + BASE, "POST", big, {**server.headers(), "Content-Type": JSON})
        assert reply.status == 413 and "over 1000 bytes" in reply.json()["message"]
        ok = request(server.url + BASE, "POST", j({"text": "fits"}), {**server.headers(), "Content-Type": JSON})
        assert ok.status == 200
    finally:
        assert server.stop() == 0, server.tail()


def test_sigterm_answers_every_admitted_request_then_exits_0(tmp_path, model_store):
    """Load queued behind one worker of batch 1, SIGTERM: every request admitted before it is answered 200, new
    ones get 503 with Retry-After while it drains, and the server exits 0."""
    server = Standalone(tmp_path, free_ports(1)[0])
    archive = str(model_store / "minilm-bucketed.mar")
    server.start(["--archive", archive, "--name", NAME, "--batch-size", "1", "--workers", "1"])
    headers = {**server.headers(), "Content-Type": JSON}
    texts = [f"request number {i} " + "with some words " * (i % 16) for i in range(24)]
    # one request of many long texts holds the only worker for seconds (about 5 s here), so that every other
    # request is admitted (queued behind it) before the signal: the check waits for all of them, not for a share
    held = j({"input": ["a long sentence of many words " * 40] * 64, "model": NAME})
    replies: dict[int, object] = {}

    def send(i: int) -> None:
        replies[i] = request(server.url + BASE, "POST", j({"text": texts[i]}), headers, timeout=120)

    def gauge(name: str) -> float:
        text = request(server.url + "/metrics", headers=headers).text
        return float(next((ln for ln in text.splitlines() if ln.startswith(name)), "x 0").split()[-1])

    pool = ThreadPoolExecutor(len(texts) + 1)
    try:
        holder = pool.submit(request, server.url + BASE + "/v1/embeddings", "POST", held, headers, timeout=120)
        deadline = time.monotonic() + 30
        while gauge("standalone_in_flight") < 1 and time.monotonic() < deadline and not holder.done():
            time.sleep(0.02)  # until the worker has taken the long one
        futures = [pool.submit(send, i) for i in range(len(texts))]
        while time.monotonic() < deadline and not holder.done():  # every request admitted and waiting
            if gauge("standalone_queue_depth") >= len(texts):
                break
            time.sleep(0.05)
        assert not holder.done() and gauge("standalone_queue_depth") >= len(texts), (
            "the long request did not hold the worker"
        )
        assert server.process is not None
        server.process.send_signal(15)
        time.sleep(0.2)
        late = request(server.url + BASE, "POST", j({"text": "late"}), headers)
        assert late.status == 503 and late.headers.get("retry-after") == "1", late.body
        for f in futures:
            f.result(timeout=120)
        assert holder.result(timeout=120).status == 200
        assert sorted(r.status for r in replies.values()) == [200] * len(texts)  # type: ignore[attr-defined]
        assert server.process.wait(60) == 0, server.tail()
    finally:
        pool.shutdown(wait=False)
        server.stop()
    assert "drain: every admitted request answered" in server.log.read_text()


def test_requests_in_flight_while_a_thread_stops_the_server(tmp_path, model_store):
    """`Standalone.stop` (what `make stop` runs) drains too: a request sent just before is answered."""
    server = start_standalone(tmp_path, model_store)
    headers = {**server.headers(), "Content-Type": JSON}
    result: list[int] = []
    sender = threading.Thread(
        target=lambda: result.append(request(server.url + BASE, "POST", j({"text": "in flight"}), headers).status)
    )
    sender.start()
    time.sleep(0.05)
    assert server.stop() == 0, server.tail()
    sender.join(60)
    assert result in ([200], [503])  # admitted before the signal: answered; after it: told to retry
