"""Our standalone KServe image (config/kserve/standalone/) run as KServe runs it, without a cluster (opt-in:
`make kserve-image-test` builds it and sets KSERVE_STANDALONE_IMAGE; podman and runc, port 8080 free).

The container gets what the pod would: `/mnt/models` mounted read-only holding `model-store/minilm-bucketed.mar`
(the same storage layout as the TorchServe runtime's), the ServingRuntime's args (`{{.Name}}` rendered), user,
capabilities and limits, on the host's network; readiness is the runtime's httpGet probe, polled as a kubelet
would from `podman run` (the cold start). Then from the host: KServe's SDK (v2 binary and JSON, v1), curl, the
OpenAI SDK at /openai/v1, every vector checked against batch-of-one; last, SIGTERM with requests in flight: every
admitted request answered and exit 0 within the pod's grace period.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from model_store.archives import ROOT
from tests.e2e.test_kserve import sdk_results
from tests.e2e.test_kserve_image import GRACE_S, PODMAN, RUN_ARGS, check_vectors, curl, podman
from tests.e2e.test_serving import texts_for_load
from tsctl import port_in_use, request

pytestmark = pytest.mark.e2e
IMAGE = os.environ.get("KSERVE_STANDALONE_IMAGE")
CONTAINER = os.environ.get("KSERVE_STANDALONE_CONTAINER", f"bucketing-sa-test-{os.getpid()}")
HERE = ROOT / "config" / "kserve" / "standalone"
ARCHIVE = ROOT / "model_store" / "minilm-bucketed.mar"
SDK_PYTHON = ROOT / ".venv-kserve" / "bin" / "python"
MODEL = "minilm-standalone"  # the InferenceService's name, which the runtime's args pass as {{.Name}}
URL = "http://127.0.0.1:8080"


def runtime_container() -> dict[str, Any]:
    doc = yaml.safe_load((HERE / "servingruntime.yaml").read_text())
    (container,) = doc["spec"]["containers"]
    return container


def run_args(container: dict[str, Any], models: Path) -> list[str]:
    security = container.get("securityContext", {})
    limits = container.get("resources", {}).get("limits", {})
    args = ["run", "-d", "--name", CONTAINER, "--network", "host", "-v", f"{models}:/mnt/models:ro", *RUN_ARGS]
    args += ["--user", str(security["runAsUser"])] if "runAsUser" in security else []
    args += [f"--cap-drop={c}" for c in security.get("capabilities", {}).get("drop", [])]
    args += ["--security-opt", "no-new-privileges"] if security.get("allowPrivilegeEscalation") is False else []
    args += ["--cpus", str(limits["cpu"])] if "cpu" in limits else []
    if "memory" in limits:
        args += ["--memory", str(limits["memory"]).replace("Gi", "g").replace("Mi", "m")]
    rendered = [a.replace("{{.Name}}", MODEL) for a in container.get("args", [])]
    return [*args, IMAGE or "", *rendered]


def ready_status() -> int | None:
    probe = runtime_container()["readinessProbe"]["httpGet"]
    try:
        return request(f"http://127.0.0.1:{probe['port']}{probe['path']}", timeout=5).status
    except OSError:
        return None


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not IMAGE:
        pytest.skip("set KSERVE_STANDALONE_IMAGE (`make kserve-image-test` builds the image and runs this)")
    assert shutil.which(PODMAN[0]), "podman is not installed (apt-get install podman runc)"
    assert ARCHIVE.is_file(), f"{ARCHIVE.name} missing: `python -m model_store.build --if-stale` builds it"
    assert not port_in_use(URL), "port 8080, which the pod takes, is in use on this machine"
    models = tmp_path_factory.mktemp("mnt-models")
    (models / "model-store").mkdir()
    shutil.copy(ARCHIVE, models / "model-store" / ARCHIVE.name)
    for path in [models, *models.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    container = runtime_container()
    podman("rm", "-f", CONTAINER, check=False)
    started = time.monotonic()
    podman(*run_args(container, models))
    try:
        seen = []
        while (status := ready_status()) != 200:
            seen.append(status)
            running = podman("inspect", "-f", "{{.State.Running}}", CONTAINER).stdout.strip()
            assert running == "true", f"the container exited: {podman('logs', CONTAINER).stderr[-3000:]}"
            assert time.monotonic() - started < 300, "not ready after 300 s"
            time.sleep(0.25)
        ready_s = time.monotonic() - started
        print(f"\nstandalone image: ready (/v2/health/ready 200) {ready_s:.1f} s after `podman run` (cold start)")
        print(f"  before that the probe saw: {sorted(set(seen), key=str)}")
        yield {"container": container, "url": URL, "ready_s": ready_s, "seen": seen}
    finally:
        podman("rm", "-f", "-t", "0", CONTAINER, check=False)


def test_image_has_no_jre_nor_torchserve_and_runs_as_1000(pod):
    assert podman("exec", CONTAINER, "id", "-u").stdout.strip() == "1000"
    assert podman("exec", CONTAINER, "sh", "-c", "command -v java", check=False).returncode != 0
    assert podman("exec", CONTAINER, "python", "-c", "import ts", check=False).returncode != 0
    size = podman("image", "inspect", "--format", "{{.Size}}", IMAGE or "").stdout.strip()
    print(f"\nstandalone image size: {int(size) / 1e9:.2f} GB")


def test_health_routes_as_kserve_probes_them(pod):
    assert 503 in pod["seen"] or None in pod["seen"] or pod["ready_s"] < 1  # not ready while the model loads
    assert request(f"{URL}/v2/health/live").json() == {"live": True}
    assert request(f"{URL}/v2/models/{MODEL}/ready").json() == {"name": MODEL, "ready": True}


@pytest.mark.parametrize("mode", ["binary", "json", "v1"])
def test_kserve_sdk(pod, reference, mode):
    if not SDK_PYTHON.exists():
        pytest.fail("the KServe SDK's venv is missing: run `make kserve-venv`")
    groups = [texts_for_load(n, seed=60 + n) for n in (3, 1, 4, 2, 3, 5)]
    results = sdk_results(URL, MODEL, "no-token-needed", groups, mode)
    for i, (group, result) in enumerate(zip(groups, results, strict=True)):
        if mode != "v1":
            assert result["id"] == f"sdk-{i}" and result["model_name"] == MODEL
        check_vectors(reference, group, result["outputs"]["embedding"])


def test_curl_v2_and_v1(pod, reference):
    texts = ["short query", "a passage about length-aware batching without TorchServe"]
    v2 = curl(
        f"{URL}/v2/models/{MODEL}/infer",
        {"id": "c1", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]},
    )
    out = next(o for o in v2["outputs"] if o["name"] == "embedding")
    assert v2["id"] == "c1" and out["shape"] == [len(texts), 384]
    check_vectors(reference, texts, [out["data"][i * 384 : (i + 1) * 384] for i in range(len(texts))])
    v1 = curl(f"{URL}/v1/models/{MODEL}:predict", {"instances": texts})
    check_vectors(reference, texts, [p["embedding"] for p in v1["predictions"]])


@pytest.mark.parametrize("base", ["/openai/v1", f"/predictions/{MODEL}/1.0/v1"])
def test_openai_sdk(pod, reference, base):
    import openai

    client = openai.OpenAI(base_url=f"{URL}{base}", api_key="no-token-needed")
    texts = texts_for_load(3, seed=77)
    reply = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    check_vectors(reference, texts, [d.embedding for d in sorted(reply.data, key=lambda d: d.index)])


def test_sigterm_answers_what_was_admitted_and_exits_0_within_the_grace_period(pod):
    texts = texts_for_load(24, seed=5)
    statuses: list[int] = []

    def send(text: str) -> None:
        body = json.dumps({"text": text}).encode()
        try:
            statuses.append(
                request(f"{URL}/predictions/{MODEL}", "POST", body, {"Content-Type": "application/json"}).status
            )
        except OSError:
            statuses.append(-1)  # not admitted: the listener had closed

    threads = [threading.Thread(target=send, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    time.sleep(0.3)
    sent = time.monotonic()
    podman("kill", "--signal", "TERM", CONTAINER)
    code = podman("wait", CONTAINER, timeout=GRACE_S + 30).stdout.strip()
    took = time.monotonic() - sent
    for t in threads:
        t.join(60)
    logs = podman("logs", CONTAINER).stderr
    print(f"\nSIGTERM -> exited {code} after {took:.1f} s (grace {GRACE_S} s); answers: {sorted(statuses)}")
    assert code == "0" and took < GRACE_S, logs[-3000:]
    assert set(statuses) <= {200, 503, -1} and "drain: every admitted request answered" in logs
