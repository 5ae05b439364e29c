"""The KServe deploy folder (config/kserve/) checked without a cluster: every YAML parses, and the manifests, the
image (Containerfile) and TorchServe's config.properties name the same ports, paths, user and model; the readiness
probe (`tsctl.ready`) judges a model description as TorchServe 0.12 writes it."""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from model_store import archives
from model_store.archives import ROOT
from tsctl import free_ports, read_properties
from tsctl.ready import BUDGET_S, main, management_url, problems, snapshot_models, workers_ready

KSERVE = ROOT / "config" / "kserve"
MODEL_ROOT = "/mnt/models"  # where KServe's storage initializer puts the storageUri's contents


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((KSERVE / name).read_text()) if d is not None]


def kind(kind: str) -> dict[str, Any]:
    (found,) = [d for name in manifests() for d in docs(name.name) if d["kind"] == kind]
    return found


def manifests() -> list[Path]:
    return sorted(KSERVE.glob("*.yaml"))


def props() -> dict[str, str]:
    return read_properties(KSERVE / "config.properties")


def container() -> dict[str, Any]:
    (only,) = kind("ServingRuntime")["spec"]["containers"]
    return only


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def port(url: str) -> int:
    parsed = urllib.parse.urlsplit(url).port
    assert parsed is not None, url
    return parsed


def containerfile() -> str:
    return (KSERVE / "Containerfile").read_text()


def test_every_yaml_parses_as_kubernetes_objects():
    assert {p.name for p in manifests()} >= {"servingruntime.yaml", "inferenceservice.yaml"}
    for path in manifests():
        for doc in docs(path.name):
            assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], path.name


def test_runtime_args_read_the_storage_initializers_layout():
    args = container()["args"]
    assert flag(args, "--ts-config") == f"{MODEL_ROOT}/config/config.properties"
    assert flag(args, "--model-store") == f"{MODEL_ROOT}/model-store" == props()["model_store"]
    probe = container()["readinessProbe"]["exec"]["command"]
    assert probe[:3] == ["python", "-m", "tsctl.ready"] and flag(probe, "--config") == flag(args, "--ts-config")
    # the image's default arguments are the runtime's: `podman run IMAGE` starts what the pod starts
    cmd = re.search(r"^CMD (\[.*\])$", containerfile(), re.M)
    assert cmd and json.loads(cmd.group(1)) == args


def test_torchserve_takes_kserves_port_and_keeps_the_rest_on_loopback():
    p = props()
    served = port(p["inference_address"])
    assert p["inference_address"] == f"http://0.0.0.0:{served}" and served == 8080
    (declared,) = container()["ports"]
    assert declared["containerPort"] == served and declared["name"] == "http1"
    assert container()["livenessProbe"]["httpGet"]["port"] == served
    assert re.search(rf"^EXPOSE {served}$", containerfile(), re.M)
    for key in ("management_address", "metrics_address"):
        assert p[key].startswith("http://127.0.0.1:"), key
    assert p["grpc_inference_address"] == p["grpc_management_address"] == "127.0.0.1"
    # auth: off (per-replica random keys), and nothing in the pod's environment may switch a setting here
    assert p["disable_token_authorization"] == "true" and p["enable_envvars_config"] == "false"
    assert p["enable_model_api"] == "false" and p["allowed_urls"] == "file:///nonexistent/.*"
    assert "service_envelope" not in p  # the handler speaks v1/v2 itself, batching on


def test_inference_service_uses_our_runtime_for_the_snapshot_model():
    isvc = kind("InferenceService")
    runtime = kind("ServingRuntime")
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"] != "kserve-torchserve"
    assert model["modelFormat"]["name"] in [f["name"] for f in runtime["spec"]["supportedModelFormats"]]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"] == ["v1", "v2"]
    # the model's name in the URLs is the InferenceService's, TorchServe's (snapshot) and the archive's
    snapshot = json.loads(props()["model_snapshot"])["models"]
    assert list(snapshot) == [isvc["metadata"]["name"]] == ["minilm"]
    (version,) = snapshot["minilm"].values()
    assert version["marName"] == f"{archives.name('bucketed')}.mar"
    assert isvc["spec"]["predictor"]["containerConcurrency"] == int(props()["job_queue_size"])
    assert model["storageUri"] == f"pvc://{kind('PersistentVolumeClaim')['metadata']['name']}/minilm"


def test_network_policy_admits_the_data_plane_ports_of_our_pods():
    policy = kind("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "serving.kserve.io/inferenceservice": kind("InferenceService")["metadata"]["name"]
    }
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    loopback = {port(props()[k]) for k in ("management_address", "metrics_address")}
    assert container()["ports"][0]["containerPort"] in ports and not ports & loopback


def test_image_runs_as_the_runtimes_non_root_user():
    security = container()["securityContext"]
    assert security["runAsNonRoot"] is True and security["allowPrivilegeEscalation"] is False
    assert re.search(rf"^USER {security['runAsUser']}:{security['runAsUser']}$", containerfile(), re.M)
    assert re.search(r'^ENTRYPOINT \["/usr/bin/tini", "--", "/usr/local/bin/ts-entrypoint"\]$', containerfile(), re.M)
    assert re.search(r"^ARG BASE_IMAGE=\S*python:3\.11-slim", containerfile(), re.M)


def test_image_packages_are_all_pinned_in_requirements():
    pins = {
        line.split("==")[0].strip().lower()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if "==" in line and not line.lstrip().startswith("#")
    }
    wanted = [
        line.strip().lower()
        for line in (KSERVE / "image-packages.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert {"torch", "torchserve", "transformers", "onnxruntime"} <= set(wanted)
    assert [w for w in wanted if w not in pins] == []


def test_build_context_admits_everything_the_containerfile_copies():
    """.dockerignore whitelists the context: a COPY source it leaves out would fail the build."""
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    admitted = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = [
        src.rstrip("/")
        for line in containerfile().splitlines()
        if line.startswith("COPY ")
        for src in line.split()[1:-1]
        if not src.startswith("--")
    ]
    mounted = re.findall(r"--mount=type=bind,source=([^,\s]+)", containerfile())
    assert sources and mounted and [s for s in sources + mounted if s not in admitted] == []


DESCRIBE = [{"modelName": "minilm", "minWorkers": 2, "workers": [{"status": "READY"}, {"status": "UNLOADING"}]}]


@pytest.mark.parametrize(
    ("describe", "ready", "words"),
    [
        (DESCRIBE, False, "1 of 2 workers READY (READY, UNLOADING)"),
        ([{"workers": [{"status": "READY"}, {"status": "READY"}]}], True, "2 of 2"),
        ([{"workers": []}], False, "0 of 2 workers READY (none)"),
        ({"code": 404}, False, "not a model description"),
        ([], False, "not a model description"),
    ],
)
def test_probe_counts_ready_workers(describe, ready, words):
    ok, what = workers_ready(describe, 2)
    assert ok is ready and words in what


def test_probe_reads_the_snapshot_and_management_address_of_the_config():
    assert snapshot_models(props()) == {"minilm": 2}
    assert management_url(props()) == "http://127.0.0.1:8081"
    assert management_url({"management_address": "http://0.0.0.0:9000"}) == "http://127.0.0.1:9000"
    with pytest.raises(ValueError, match="no model_snapshot"):
        snapshot_models({})
    with pytest.raises(ValueError, match="not TorchServe's snapshot JSON"):
        snapshot_models({"model_snapshot": "{"})


@pytest.mark.parametrize(
    "snapshot",
    [
        '{"models": []}',
        '{"models": {"m": {}}}',
        '{"models": {"m": []}}',
        '{"models": {"m": {"1.0": 3}}}',
        "[]",
        '{"models": {"m": {"1.0": {"minWorkers": "x"}}}}',
    ],
)
def test_probe_refuses_a_malformed_snapshot_in_one_line(snapshot):
    with pytest.raises(ValueError, match="not TorchServe's snapshot JSON"):
        snapshot_models({"model_snapshot": snapshot})


def test_probe_fails_in_one_line_without_a_snapshot_or_a_server(tmp_path, capsys):
    config = tmp_path / "config.properties"
    config.write_text("management_address=http://127.0.0.1:8081\n")
    assert main(["--config", str(config)]) == 1
    assert capsys.readouterr().err == (
        "not ready: the config has no model_snapshot: no model is loaded at start, so none can be waited for\n"
    )
    (unused,) = free_ports(1)  # nothing listens there
    config.write_text(f"management_address=http://127.0.0.1:{unused}\nmodel_snapshot={props()['model_snapshot']}\n")
    assert main(["--config", str(config), "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("not ready: minilm: management API at http://127.0.0.1:") and err.count("\n") == 1
    assert main(["--config", str(tmp_path / "missing.properties")]) == 1
    assert capsys.readouterr().err.startswith("not ready: [Errno 2]")


def test_probe_calls_share_one_budget_within_the_probes_timeout():
    """A hung management API: each call gets what is left of the budget, and the models not asked in time are named
    (the kubelet would otherwise kill the probe at timeoutSeconds before it says why)."""
    snapshot = {"models": {m: {"1.0": {"defaultVersion": True, "minWorkers": 1}} for m in ("a", "b", "c")}}
    config = {"model_snapshot": json.dumps(snapshot)}
    now = [0.0]
    given = []

    def hung(url, timeout):
        given.append(timeout)
        now[0] += timeout  # the call waits its whole timeout, then fails
        raise TimeoutError("timed out")

    found = problems(config, 3.0, ask=hung, clock=lambda: now[0])
    assert given == [3.0] and found[1:] == [
        "b: not asked, the probe's 3 s ran out",
        "c: not asked, the probe's 3 s ran out",
    ]
    assert found[0].startswith("a: management API at http://127.0.0.1:8081 unreachable (TimeoutError)")
    assert BUDGET_S < container()["readinessProbe"]["timeoutSeconds"]
