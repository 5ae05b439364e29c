"""Our KServe image run as KServe runs it, without a cluster (opt-in: `make kserve-image-test` builds the image and
sets KSERVE_IMAGE; it needs podman and runc, and ports 8080-8082 and 7070-7071 free).

The container gets what the pod would: `/mnt/models` mounted read-only holding `config/config.properties` and
`model-store/minilm-bucketed.mar` (the storage initializer's layout), the ServingRuntime's args, env, user and
capabilities (read from `config/kserve/servingruntime.yaml`), plus the `TS_SERVICE_ENVELOPE=kservev2` that KServe's
own TorchServe runtime sets, on the host's network. Its readiness is the runtime's exec probe, run as the kubelet
runs it; then, from the host, KServe's SDK (v2 binary and JSON, v1), curl and the OpenAI route, every vector
checked against batch-of-one; last, SIGTERM ends it within the pod's grace period, the frontend's shutdown hook
having run.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from bench.harness.stats import parse_prometheus
from model_store.archives import ROOT
from tests.e2e.test_kserve import sdk_results
from tests.e2e.test_serving import texts_for_load
from tsctl import port_in_use, read_properties, request

pytestmark = pytest.mark.e2e
IMAGE = os.environ.get("KSERVE_IMAGE")
PODMAN = shlex.split(os.environ.get("KSERVE_PODMAN", "podman --runtime runc --cgroup-manager cgroupfs"))
RUN_ARGS = shlex.split(os.environ.get("KSERVE_PODMAN_RUN_ARGS", ""))  # this machine's own (image-test.sh says why)
CONTAINER = os.environ.get("KSERVE_CONTAINER", f"bucketing-ts-test-{os.getpid()}")
KSERVE = ROOT / "config" / "kserve"
ARCHIVE = ROOT / "model_store" / "minilm-bucketed.mar"
SDK_PYTHON = ROOT / ".venv-kserve" / "bin" / "python"
GRACE_S = 30  # Kubernetes' default terminationGracePeriodSeconds (our manifests set none)
OLD_RUNTIME_ENV = {"TS_SERVICE_ENVELOPE": "kservev2"}  # what kserve-torchserve sets for v2: must change nothing
MODEL = "minilm"


def runtime_container() -> dict[str, Any]:
    """The one container of our ServingRuntime, as the manifest declares it."""
    doc = yaml.safe_load((KSERVE / "servingruntime.yaml").read_text())
    (container,) = doc["spec"]["containers"]
    return container


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    run = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and run.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:2])} failed ({run.returncode}): {run.stderr.strip()[-2000:]}")
    return run


def run_args(container: dict[str, Any], models: Path) -> list[str]:
    """`podman run` as the kubelet would start the container: user, capabilities, limits, env, args."""
    security = container.get("securityContext", {})
    limits = container.get("resources", {}).get("limits", {})
    args = ["run", "-d", "--name", CONTAINER, "--network", "host", "-v", f"{models}:/mnt/models:ro", *RUN_ARGS]
    if "runAsUser" in security:
        args += ["--user", str(security["runAsUser"])]
    args += [f"--cap-drop={c}" for c in security.get("capabilities", {}).get("drop", [])]
    if security.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    if "cpu" in limits:
        args += ["--cpus", str(limits["cpu"])]
    if "memory" in limits:
        args += ["--memory", str(limits["memory"]).replace("Gi", "g").replace("Mi", "m")]
    env = {e["name"]: e["value"] for e in container.get("env", [])} | OLD_RUNTIME_ENV
    args += [f"--env={k}={v}" for k, v in env.items()]
    return [*args, IMAGE or "", *container.get("args", [])]


def probe(container: dict[str, Any]) -> subprocess.CompletedProcess:
    """The runtime's readiness probe, run in the container as the kubelet runs an exec probe."""
    spec = container["readinessProbe"]
    return podman("exec", CONTAINER, *spec["exec"]["command"], timeout=spec.get("timeoutSeconds", 5) + 30, check=False)


def ping(inference_address: str) -> int | None:
    """TorchServe's `/ping` status (None: nothing answers yet)."""
    try:
        return request(f"{inference_address.replace('0.0.0.0', '127.0.0.1')}/ping", timeout=5).status
    except OSError:
        return None


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not IMAGE:
        pytest.skip("set KSERVE_IMAGE (`make kserve-image-test` builds the image and runs this)")
    assert shutil.which(PODMAN[0]), "podman is not installed (apt-get install podman runc)"
    assert ARCHIVE.is_file(), f"{ARCHIVE.name} missing: `python -m model_store.build --if-stale` builds it"
    props = read_properties(KSERVE / "config.properties")
    urls = [props["inference_address"], props["management_address"], props["metrics_address"]]
    urls += [f"http://127.0.0.1:{props[k]}" for k in ("grpc_inference_port", "grpc_management_port")]
    busy = [u for u in urls if port_in_use(u.replace("0.0.0.0", "127.0.0.1"))]
    assert not busy, f"ports the pod takes are in use on this machine: {busy}"
    # the storage initializer's layout, readable by the container's user (uid 1000), mounted read-only
    models = tmp_path_factory.mktemp("mnt-models")
    (models / "config").mkdir()
    (models / "model-store").mkdir()
    shutil.copy(KSERVE / "config.properties", models / "config" / "config.properties")
    shutil.copy(ARCHIVE, models / "model-store" / ARCHIVE.name)
    for path in [models, *models.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    container = runtime_container()
    podman("rm", "-f", CONTAINER, check=False)
    started = time.monotonic()
    podman(*run_args(container, models))
    try:
        seen = []  # (the probe's answer, TorchServe's /ping status) at each poll, as a kubelet would see them
        while True:
            answer = probe(container)
            seen.append(((answer.stderr or answer.stdout).strip(), ping(props["inference_address"])))
            if answer.returncode == 0:
                break
            running = podman("inspect", "-f", "{{.State.Running}}", CONTAINER).stdout.strip()
            assert running == "true", f"the container exited: {podman('logs', CONTAINER).stdout[-3000:]}"
            assert time.monotonic() - started < 300, f"not ready after 300 s: {seen[-1][0]}"
            time.sleep(1)
        ready_s = time.monotonic() - started
        print(f"\nready (the runtime's exec probe) {ready_s:.1f} s after `podman run`; before that, the probe said:")
        for said, ping_status in dict(seen).items():  # each distinct answer once
            print(f"  {said}   [/ping: {ping_status}]")
        yield {"container": container, "props": props, "seen": seen, "url": "http://127.0.0.1:8080"}
    finally:
        podman("rm", "-f", "-t", "0", CONTAINER, check=False)


def check_vectors(reference, texts: list[str], vectors: Any) -> None:
    vectors = np.asarray(vectors, dtype=np.float64)
    assert vectors.shape == (len(texts), 384)
    for text, vector in zip(texts, vectors, strict=True):
        assert np.max(np.abs(vector - reference(text))) <= 1e-5, text


def test_image_holds_our_pins_as_a_non_root_user(pod):
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    wanted = [
        line.strip().lower()
        for line in (KSERVE / "image-packages.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    freeze = podman("exec", CONTAINER, "pip", "list", "--format", "json").stdout
    installed = {p["name"].lower(): p["version"] for p in json.loads(freeze)}
    for name in wanted:
        assert installed[name].split("+")[0] == pins[name], (name, installed[name])
    assert installed["torch"].endswith("+cpu") and "torchserve-bucketing" in installed
    assert podman("exec", CONTAINER, "id", "-u").stdout.strip() == "1000"
    java = podman("exec", CONTAINER, "java", "-version").stderr
    assert '"17.' in java, java
    print(
        f"\nimage: torch {installed['torch']}, transformers {installed['transformers']}, onnxruntime "
        f"{installed['onnxruntime']}, torchserve {installed['torchserve']}, {java.splitlines()[0]}, uid 1000"
    )


def test_readiness_probe_tells_the_truth(pod):
    said = [answer for answer, _ in pod["seen"]]
    assert said[0].startswith("not ready") and said[-1] == "ready", "the probe passed before any worker could load"
    # while workers were still loading, TorchServe's /ping already answered 200: no readiness signal
    assert any("workers READY" in answer and status == 200 for answer, status in pod["seen"][:-1])
    base = pod["props"]["management_address"]
    workers = request(f"{base}/models/{MODEL}").json()[0]["workers"]
    assert [w["status"] for w in workers] == ["READY", "READY"]
    # TorchServe 0.12 serves none of the v2 health routes (without `ts_open_inference_protocol`, whose server
    # "ready" is a constant true): KServe's readiness is the exec probe's
    assert request(f"{pod['url']}/v2/models/{MODEL}/ready").status == 404


@pytest.mark.parametrize("mode", ["binary", "json", "v1"])
def test_kserve_sdk(pod, reference, mode):
    if not SDK_PYTHON.exists():
        pytest.fail("the KServe SDK's venv is missing: run `make kserve-venv`")
    groups = [texts_for_load(n, seed=60 + n) for n in (3, 1, 4, 2, 3, 5)]
    results = sdk_results(pod["url"], MODEL, "no-token-needed", groups, mode)
    for i, (group, result) in enumerate(zip(groups, results, strict=True)):
        if mode != "v1":
            assert result["id"] == f"sdk-{i}" and result["model_name"] == MODEL
        check_vectors(reference, group, result["outputs"]["embedding"])


def curl(url: str, body: dict[str, Any]) -> Any:
    run = subprocess.run(
        ["curl", "-sS", "--fail-with-body", "-H", "Content-Type: application/json", "-d", json.dumps(body), url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout[-1000:] + run.stderr[-1000:]
    return json.loads(run.stdout)


def test_curl_v2_and_v1(pod, reference):
    texts = ["short query", "a passage about length-aware batching in TorchServe"]
    v2 = curl(
        f"{pod['url']}/v2/models/{MODEL}/infer",
        {"id": "c1", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]},
    )
    out = next(o for o in v2["outputs"] if o["name"] == "embedding")
    assert v2["id"] == "c1" and out["shape"] == [len(texts), 384]
    check_vectors(reference, texts, np.asarray(out["data"]).reshape(out["shape"]))
    v1 = curl(f"{pod['url']}/v1/models/{MODEL}:predict", {"instances": texts})
    check_vectors(reference, texts, [p["embedding"] for p in v1["predictions"]])


def test_openai_route(pod, reference):
    import openai

    client = openai.OpenAI(base_url=f"{pod['url']}/predictions/{MODEL}/1.0/v1", api_key="no-token-needed")
    texts = texts_for_load(3, seed=77)
    reply = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    check_vectors(reference, texts, [d.embedding for d in sorted(reply.data, key=lambda d: d.index)])


def test_batching_was_on(pod):
    """The concurrent SDK calls were delivered in batches larger than one (the snapshot's batchSize 16)."""
    figures = parse_prometheus(request(f"{pod['props']['metrics_address']}/metrics").text, MODEL)
    print(f"\n{figures['bucket_requests_total']:.0f} requests in {figures['bucket_batches_total']:.0f} batches")
    assert figures["bucket_batches_total"] < figures["bucket_requests_total"]


def test_sigterm_stops_it_within_the_grace_period(pod):
    """What the kubelet does at a pod's deletion: SIGTERM to the container, SIGKILL after the grace period."""
    sent = time.monotonic()
    podman("kill", "--signal", "TERM", CONTAINER)
    code = podman("wait", CONTAINER, timeout=GRACE_S + 30).stdout.strip()
    took = time.monotonic() - sent
    logs = podman("logs", CONTAINER).stdout + podman("logs", CONTAINER).stderr
    print(f"\nSIGTERM -> container exited {code} after {took:.1f} s (grace period {GRACE_S} s)")
    assert took < GRACE_S, f"took {took:.1f} s"
    assert code == "0", logs[-3000:]
    assert "ts-entrypoint: stopping TorchServe" in logs
    # every process ended by the frontend, or by the entrypoint's SIGTERM after it; none needed SIGKILL
    report = [line for line in logs.splitlines() if line.startswith("ts-entrypoint: ")]
    print("\n".join(report))
    assert "ts-entrypoint: TorchServe exited (0)" in logs or "after TorchServe exited (0)" in logs, logs[-2000:]
    assert "SIGKILL" not in logs
