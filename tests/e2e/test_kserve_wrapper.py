"""KServe's real data plane in front of TorchServe, without a cluster: TorchServe 0.12's `kserve_wrapper`
(what the `pytorch/torchserve-kfs:0.12.0` image runs on port 8080) forwarding KServe v1 and v2 requests to a
TorchServe started from `config/kserve/config.properties` (ports moved to free loopback ones), batching on.

Opt-in: the wrapper is not on any package registry. Set KSERVE_WRAPPER_DIR to a folder holding it ready to run
(`__main__.py`, `TorchserveModel.py`, `TSModelRepository.py`, `gprc_utils.py` and the generated
`inference_pb2*.py`/`management_pb2*.py`, as in the image's kserve_wrapper folder) and
KSERVE_WRAPPER_PYTHON to a Python with the image's `kserve[storage]==0.13.0`. Needs ports 8080 and 8081 free.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from bench.harness.stats import parse_prometheus
from model_store.archives import ROOT
from tests.e2e.test_serving import texts_for_load
from tsctl import Endpoints, TorchServe, free_ports, port_in_use, request

pytestmark = pytest.mark.e2e
WRAPPER = os.environ.get("KSERVE_WRAPPER_DIR")
PYTHON = os.environ.get("KSERVE_WRAPPER_PYTHON")
WRAPPER_URL = "http://127.0.0.1:8080"  # fixed in the wrapper


@pytest.fixture(scope="module")
def kserve_torchserve(tmp_path_factory, request):
    if not (WRAPPER and PYTHON):
        pytest.skip(
            "set KSERVE_WRAPPER_DIR and KSERVE_WRAPPER_PYTHON to run TorchServe's kserve_wrapper (see docstring)"
        )
    if port_in_use(WRAPPER_URL) or port_in_use("http://127.0.0.1:8081"):
        pytest.skip("ports 8080/8081, which the wrapper always takes, are in use")
    model_store = request.getfixturevalue("model_store")  # built only when the test runs
    server = TorchServe(
        tmp_path_factory.mktemp("kserve"),
        Endpoints.on_ports(*free_ports(3)),
        model_store=model_store,
        base_properties=ROOT / "config" / "kserve" / "config.properties",
    )
    with server:
        server.client.wait_ready("minilm", 2, 180)
        yield server


def run_wrapper(server: TorchServe, protocol: str, folder: Path) -> subprocess.Popen:
    """The wrapper as the image's entrypoint starts it, reading our config (with the moved ports)."""
    assert PYTHON is not None  # the fixture skips without it
    config = folder / f"wrapper-{protocol}.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in server.properties.items()))
    env = {
        **os.environ,
        "CONFIG_PATH": str(config),
        "PROTOCOL_VERSION": protocol,
        "MODEL_LOAD_DELAY": "1",
        "MODEL_LOAD_MAX_TRY": "30",
    }
    log = open(folder / f"wrapper-{protocol}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([PYTHON, "__main__.py"], cwd=WRAPPER, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    ready = f"{WRAPPER_URL}/v2/models/minilm/ready" if protocol == "v2" else f"{WRAPPER_URL}/v1/models/minilm"
    try:
        while time.monotonic() < deadline:
            try:
                if request(ready, timeout=5).status == 200:
                    return proc
            except OSError:
                pass
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    except BaseException:  # Ctrl-C, SIGTERM: the wrapper ends with the wait
        stop(proc)
        raise
    stop(proc)
    raise AssertionError(f"the wrapper did not get ready: {(folder / f'wrapper-{protocol}.log').read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.mark.parametrize("protocol", ["v2", "v1"])
def test_wrapper_forwards_to_the_handler_with_batching(kserve_torchserve, reference, tmp_path, protocol):
    proc = run_wrapper(kserve_torchserve, protocol, tmp_path)
    before = parse_prometheus(kserve_torchserve.client.metrics(), "minilm")
    try:
        groups = [texts_for_load(n, seed=40 + n) for n in (1, 2, 3, 4, 2, 1, 3, 2)]

        def call(i: int):
            group = groups[i]
            if protocol == "v2":
                tensor = {"name": "text", "datatype": "BYTES", "shape": [len(group)], "data": group}
                body, path = {"id": f"w{i}", "inputs": [tensor]}, "/v2/models/minilm/infer"
            else:
                body, path = {"instances": group}, "/v1/models/minilm:predict"
            return request(WRAPPER_URL + path, "POST", json.dumps(body), {"Content-Type": "application/json"})

        with ThreadPoolExecutor(len(groups)) as pool:
            replies = list(pool.map(call, range(len(groups))))
        for group, reply in zip(groups, replies, strict=True):
            assert reply.status == 200, reply.text[:500]
            if protocol == "v2":
                out = next(o for o in reply.json()["outputs"] if o["name"] == "embedding")
                vectors = np.asarray(out["data"]).reshape(out["shape"])
            else:
                vectors = np.asarray([p["embedding"] for p in reply.json()["predictions"]])
            for text, vector in zip(group, vectors, strict=True):
                assert np.max(np.abs(vector - reference(text))) <= 1e-5
        after = parse_prometheus(kserve_torchserve.client.metrics(), "minilm")
        requests = after["bucket_requests_total"] - before["bucket_requests_total"]
        batches = after["bucket_batches_total"] - before["bucket_batches_total"]
        print(f"{protocol} through kserve_wrapper: {requests:.0f} requests in {batches:.0f} batches")
        assert requests == len(groups) and batches < requests, "TorchServe delivered no batch larger than 1"
    finally:
        stop(proc)
