"""config/ray/rayservice.yaml (KubeRay) without a cluster: it parses, its serveConfigV2 is a config Ray Serve accepts
and names the same application as config/ray/serve.yaml (import path, model, routes), and its ports line up."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "config" / "ray" / "rayservice.yaml"
SERVE = ROOT / "config" / "ray" / "serve.yaml"


def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def test_rayservice_parses_and_names_the_application():
    doc = manifest()
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayService"
    serve_config = yaml.safe_load(doc["spec"]["serveConfigV2"])
    from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(serve_config)
    (app,) = serve_config["applications"]
    shipped = yaml.safe_load(SERVE.read_text())["applications"][0]
    assert app["import_path"] == shipped["import_path"] == "bucketing.hosts.ray.app:build"
    assert app["name"] == shipped["name"] and app["route_prefix"] == "/"
    model = app["args"]["models"][0]
    assert model["name"] == shipped["args"]["models"][0]["name"] == "minilm-bucketed"
    assert model["model"].startswith("/mnt/models/")
    names = {d["name"] for d in app["deployments"]}
    assert names == {"minilm-bucketed", "Ingress"}
    from bucketing.hosts.ray.args import AppArgs

    AppArgs.parse(app["args"])  # the builder's own check of its args


def test_rayservice_ports_resources_and_key():
    doc = manifest()
    serve_config = yaml.safe_load(doc["spec"]["serveConfigV2"])
    port = serve_config["http_options"]["port"]
    cluster = doc["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == "2.60.0"
    head = cluster["headGroupSpec"]
    head_ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert head_ports["serve"] == port and head_ports["gcs-server"] == 6379 and head_ports["dashboard"] == 8265
    assert head["rayStartParams"]["num-cpus"] == "0"  # no replica on the head
    (workers,) = cluster["workerGroupSpecs"]
    worker = workers["template"]["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in worker["ports"]}["serve"] == port
    app = serve_config["applications"][0]
    threads = app["args"]["models"][0]["threads"]
    assert workers["rayStartParams"]["num-cpus"] == str(threads)  # one replica per worker pod
    assert '"encoder\\": 1' in workers["rayStartParams"]["resources"]
    assert app["args"]["models"][0]["ray_actor_options"]["resources"] == {"encoder": 1}
    for container in (head["template"]["spec"]["containers"][0], worker):
        env = {e["name"]: e for e in container["env"]}
        assert env["BUCKETING_INFERENCE_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "bucketing-inference-key"
        assert container["image"] == "bucketing-ray:0.2.0"
    assert "key_file" not in app["args"] and not app["args"].get("no_auth")  # the key from the environment


def test_the_head_pod_drains_the_ingress_before_it_stops():
    """The head's `preStop` runs the ingress's drain (args our driver accepts, the GCS port, the application's
    name), within the pod's grace period with room to join the cluster."""
    from bucketing.hosts.ray.drain import APP, parser

    doc = manifest()
    head = doc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    command = head["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:3] == ["python", "-m", "bucketing.hosts.ray.drain"]
    args = parser().parse_args(command[3:])
    serve_config = yaml.safe_load(doc["spec"]["serveConfigV2"])
    assert args.address == "127.0.0.1:6379" and args.app == APP == serve_config["applications"][0]["name"]
    assert head["terminationGracePeriodSeconds"] >= args.timeout + 30  # joining the cluster, then Ray's own stop
