"""The standalone KServe runtime (config/kserve/standalone/) checked without a cluster: the manifests parse, name
port 8080 and probe paths the server serves, pass arguments the server's command line takes, and the image has no
JRE or TorchServe and only pinned packages."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from bucketing.hosts import routes
from bucketing.hosts.standalone.__main__ import parser
from model_store.archives import ROOT

HERE = ROOT / "config" / "kserve" / "standalone"


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((HERE / name).read_text()) if d is not None]


def runtime() -> dict[str, Any]:
    (doc,) = docs("servingruntime.yaml")
    return doc


def container() -> dict[str, Any]:
    (only,) = runtime()["spec"]["containers"]
    return only


def test_every_manifest_parses_as_kubernetes_objects():
    found = {d["kind"] for p in HERE.glob("*.yaml") for d in docs(p.name)}
    assert found == {"ServingRuntime", "InferenceService", "NetworkPolicy"}
    for path in HERE.glob("*.yaml"):
        for doc in docs(path.name):
            assert doc["apiVersion"] and doc["metadata"]["name"], path.name


def test_the_runtime_serves_kserves_protocols_on_8080_with_probes_on_served_paths():
    spec = runtime()["spec"]
    assert spec["protocolVersions"] == ["v1", "v2"]
    c = container()
    assert [p["containerPort"] for p in c["ports"]] == [8080] and c["ports"][0]["name"] == "http1"
    ready, live = c["readinessProbe"]["httpGet"], c["livenessProbe"]["httpGet"]
    assert (ready["path"], ready["port"], live["path"], live["port"]) == (
        "/v2/health/ready",
        8080,
        "/v2/health/live",
        8080,
    )
    assert routes.match("GET", ready["path"], {}).action == "ready"
    assert routes.match("GET", live["path"], {}).action == "live"


def test_the_runtime_args_are_the_servers_own_flags_over_mnt_models():
    args = parser().parse_args([a.replace("{{.Name}}", "minilm-standalone") for a in container()["args"]])
    assert (args.model, args.host, args.port, args.no_auth) == (Path("/mnt/models"), "0.0.0.0", 8080, True)
    assert args.name == "minilm-standalone" and args.grace_period <= 30  # Kubernetes' default grace period
    assert args.drain_timeout is None  # the grace period less what closing connections needs


def test_the_inference_service_uses_the_runtime_and_the_network_policy_admits_8080():
    (isvc,) = [d for d in docs("inferenceservice.yaml") if d["kind"] == "InferenceService"]
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime()["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime()["spec"]["supportedModelFormats"]}
    assert model["storageUri"].startswith("pvc://")
    (policy,) = [d for d in docs("inferenceservice.yaml") if d["kind"] == "NetworkPolicy"]
    assert 8080 in {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    selector = policy["spec"]["podSelector"]["matchLabels"]["serving.kserve.io/inferenceservice"]
    assert selector == isvc["metadata"]["name"]


def test_the_image_has_no_jre_nor_torchserve_and_only_pinned_packages_and_runs_as_1000():
    text = (HERE / "Containerfile").read_text()
    assert "openjdk" not in text and "--uid 1000" in text and "USER 1000:1000" in text
    assert '"python", "-m", "bucketing.hosts.standalone"' in text and "EXPOSE 8080" in text
    pins = {
        line.split("==")[0].strip().lower()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if "==" in line and not line.lstrip().startswith("#")
    }
    wanted = [
        line.strip().lower()
        for line in (HERE / "image-packages.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert "uvicorn" in wanted and "torchserve" not in wanted and [w for w in wanted if w not in pins] == []
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    admitted = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = [
        src.rstrip("/")
        for line in text.splitlines()
        if line.startswith("COPY ")
        for src in line.split()[1:-1]
        if not src.startswith("--")
    ]
    mounted = re.findall(r"--mount=type=bind,source=([^,\s]+)", text)
    assert sources and [s for s in sources + mounted if s not in admitted] == []
