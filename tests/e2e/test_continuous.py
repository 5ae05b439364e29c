"""`handler.schedule: continuous` on a real TorchServe (`continuousBatching: true`): curl-style native, text/plain,
OpenAI and KServe v1/v2 requests of very different lengths under concurrency, each answered exactly as alone; and a
worker killed mid-call leaves no request hanging and none answered wrong. (The OpenAI and KServe SDK tests run
through this archive too.)"""

from __future__ import annotations

import asyncio
import json
import random

import numpy as np
import pytest

from tests.e2e.conftest import SCHEDULED
from tests.e2e.test_resilience import POOL, fire, load_and_kill, worker_pids
from tsctl import Endpoints, TorchServe, free_ports

pytestmark = pytest.mark.e2e
NAME = "cont"


@pytest.fixture(scope="module")
def cont(tmp_path_factory, model_store):
    server = TorchServe(tmp_path_factory.mktemp("cont"), Endpoints.on_ports(*free_ports(3)), model_store=model_store)
    server.start()
    try:
        server.client.register(
            SCHEDULED["continuous"], NAME, batch_size=8, max_batch_delay=10, workers=1, response_timeout=20
        )
        yield server
    finally:
        server.stop()


def test_torchserve_runs_its_continuous_batching(cont):
    described = cont.client.call("management", "GET", f"/models/{NAME}").json()[0]
    assert described["continuousBatching"] is True


def test_every_wire_format_under_concurrency(cont, reference):
    rng = random.Random(11)
    texts = [rng.choice(POOL) for _ in range(40)]
    bodies = []
    for i, text in enumerate(texts):
        kind = i % 4
        if kind == 0:
            bodies.append((json.dumps({"text": text}).encode(), "application/json", ""))
        elif kind == 1:
            bodies.append((text.encode(), "text/plain", ""))
        elif kind == 2:
            bodies.append(
                (json.dumps({"input": text, "model": NAME}).encode(), "application/json", "/1.0/v1/embeddings")
            )
        else:
            v2 = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
            bodies.append((json.dumps(v2).encode(), "application/json", ""))
    headers = cont.client.keys.headers("inference")
    base = f"{cont.endpoints.inference}/predictions/{NAME}"

    async def run():
        groups = {}
        for path in {p for _, _, p in bodies}:
            mine = [(i, b, c) for i, (b, c, p) in enumerate(bodies) if p == path]
            got = await fire(base + path, headers, [(b, c) for _, b, c in mine], 12)
            groups.update({i: r for (i, _, _), r in zip(mine, got)})
        return [groups[i] for i in range(len(bodies))]

    replies = asyncio.run(run())
    for i, (text, (status, body, _)) in enumerate(zip(texts, replies, strict=True)):
        assert status == 200, body[:300]
        answer = json.loads(body)
        kind = i % 4
        if kind in (0, 1):
            vector = answer["embedding"]
        elif kind == 2:
            vector = answer["data"][0]["embedding"]
        else:
            vector = answer["outputs"][0]["data"]
        assert np.max(np.abs(np.asarray(vector) - reference(text))) <= 1e-5


def test_a_killed_worker_leaves_nothing_hanging_or_wrong(cont, reference):
    (pid,) = worker_pids(cont.client, NAME)
    rng = random.Random(12)
    texts = [rng.choice(POOL) for _ in range(120)]
    url = f"{cont.endpoints.inference}/predictions/{NAME}"
    load_and_kill(url, cont.client.keys.headers("inference"), texts, pid, 8, reference)
