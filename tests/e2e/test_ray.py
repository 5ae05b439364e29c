"""The Ray host on one local node (`tsctl.ray.RayServe`: `make serve-ray`'s path, on free ports in a test folder):
the same requests as `test_hosts.py` answered with the standalone host's status, content type and bytes (which are
TorchServe's), embeddings within 1e-5 of sentence-transformers', a bulk request over the token budget served
alone by the replica's batcher, its own 401, its `/metrics` (the queue signals and handler counters summed over
replicas, the gauges back to 0 after load), and every Ray process gone after `stop`.

The multi-node checks (replicas on distinct nodes, a replica and a node killed under load, autoscaling) are
`test_ray_cluster.py`, opt-in (`make ray-test`)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml

from bucketing.hosts.ray.args import fix_replicas
from bucketing.metrics import CAPACITY, QUEUE_GAUGES, signal_names
from tests.e2e.test_hosts import BASE, CASES, JSON, NAME, Host, j, start_standalone, unique
from tests.e2e.test_lifecycle import readiness_while_starting
from tsctl import free_ports, request
from tsctl.ray import CONFIG, RayServe

pytestmark = pytest.mark.e2e
TEXTS = ["short query", "a somewhat longer passage about bucketing requests by length", "caf\u00e9 au lait"]


def vectors(reply) -> np.ndarray:
    """The embeddings of a native `{"texts": [...]}` answer (a list of `{"embedding": [...]}`)."""
    return np.array([row["embedding"] for row in reply.json()])


def ray_processes(temp_dir: Path) -> list[str]:
    """Command lines of live processes naming our Ray temp folder (raylet, GCS, agents), or Ray workers whose
    parent is gone with it: anything the cluster left."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(temp_dir) in cmd:
            found.append(f"{proc.name} {cmd[:160]}")
    return found


def shared_batching_config() -> dict:
    """config/ray/serve.yaml with test_hosts' batching (batch 8, 100 ms), one replica (no autoscaling)."""
    base = yaml.safe_load(CONFIG.read_text())
    app = base["applications"][0]
    app["args"]["models"][0].update({"batch_size": 8, "max_batch_delay_ms": 100, "threads": 1})
    for deployment in app["deployments"]:
        if deployment["name"] == "minilm-bucketed":
            fix_replicas(deployment, 1)
    return base


def session_log_lines(temp_dir: Path, pattern: str, needle: str) -> list[tuple[Path, str]]:
    """Each (log, line) holding `needle` in the cluster's session logs matching `pattern` (under `logs/`)."""
    found = []
    for log in temp_dir.glob(f"session_*/logs/{pattern}"):
        try:
            text = log.read_text(errors="replace") if log.is_file() else ""
        except OSError:
            continue
        found += [(log, line) for line in text.splitlines() if needle in line]
    return found


def warmed_lines(temp_dir: Path) -> int:
    """How many of the cluster's logs hold a worker's ready line after its warm-up pass (a replica's constructor)."""
    return len({log for log, _ in session_log_lines(temp_dir, "**/*", "warmed up (1 pass")})


def scaled_lines(temp_dir: Path) -> list[str]:
    """The Serve controller's log lines saying it scaled a deployment (Ray 2.60: "Upscaling ...", "Downscaling ...")."""
    return [line for _, line in session_log_lines(temp_dir, "serve/controller_*.log", "scaling Deployment(")]


@pytest.fixture(scope="module")
def ray_host(tmp_path_factory, model_store):
    """The Ray host, its readiness routes asked from its first listening moment until the first 200: what each
    said (`server.readiness`) and how many logs held a warmed-up ready line then (`server.warmed_at_ready`)."""
    server = RayServe(tmp_path_factory.mktemp("ray"), free_ports(1)[0], num_cpus=1)
    failed: list[BaseException] = []

    def start() -> None:
        try:
            server.start(model_store / "minilm-bucketed.mar", NAME, base=shared_batching_config())
        except BaseException as e:  # noqa: BLE001 - raised again below, in the test's thread
            failed.append(e)

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    try:
        seen = readiness_while_starting(server, NAME, starting, ("health", "model"))
        warmed = warmed_lines(server.temp_dir) if ("health", 200) in seen else -1
        starting.join(600)
        if failed:
            raise failed[0]
        server.readiness, server.warmed_at_ready = seen, warmed  # type: ignore[attr-defined]
        yield server
    finally:
        while starting.is_alive():  # an interrupt while it starts: its start stops what it launched
            server.stop()
            starting.join(1.0)
        server.stop()
        left = ray_processes(server.temp_dir)
        assert not left, f"Ray processes left after stop: {left}"
        shutil.rmtree(server.temp_dir, ignore_errors=True)  # Ray's session logs, a folder per test run


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, model_store):
    server = start_standalone(tmp_path_factory.mktemp("standalone-for-ray"), model_store)
    try:
        yield server
    finally:
        assert server.stop() == 0, server.tail()


@pytest.fixture(scope="module")
def hosts(ray_host, standalone) -> dict[str, Host]:
    return {
        "standalone": Host("standalone", standalone.url, standalone.headers()),
        "ray": Host("ray", ray_host.url, ray_host.headers()),
    }


@pytest.mark.parametrize(("case", "method", "path", "body", "headers"), CASES, ids=[c[0] for c in CASES])
def test_ray_answers_the_standalone_hosts_bytes(hosts, case, method, path, body, headers):
    sa = hosts["standalone"].call(method, path, body, headers)
    ra = hosts["ray"].call(method, path, body, headers)
    assert (ra.status, ra.headers.get("content-type"), unique(ra.body)) == (
        sa.status,
        sa.headers.get("content-type"),
        unique(sa.body),
    ), f"{case}: standalone {sa.status} {sa.body[:300]!r}\nray {ra.status} {ra.body[:300]!r}"
    length = "inference-header-content-length"
    assert ra.headers.get(length) == sa.headers.get(length)


def test_ray_matches_sentence_transformers(hosts):
    import sentence_transformers

    from model_store.archives import minilm_dir

    model = sentence_transformers.SentenceTransformer(str(minilm_dir()), device="cpu")
    expected = model.encode(TEXTS, convert_to_numpy=True)
    reply = hosts["ray"].call("POST", BASE, j({"texts": TEXTS}), {"Content-Type": JSON})
    assert reply.status == 200, reply.body[:300]
    got = vectors(reply)
    assert np.max(np.abs(got - expected)) <= 1e-5


def test_ray_serves_concurrent_requests_and_a_bulk_one(hosts):
    """Concurrent requests batched by the replica's batcher, and one over the token budget (handler.max_batch_tokens),
    a batch alone, answered as the standalone host answers it."""
    ray = hosts["ray"]
    with ThreadPoolExecutor(8) as pool:
        replies = list(
            pool.map(lambda i: ray.call("POST", BASE, j({"text": f"text {i}"}), {"Content-Type": JSON}), range(24))
        )
    assert [r.status for r in replies] == [200] * 24
    bulk = j({"texts": [f"passage number {i} " + "word " * 50 for i in range(160)]})
    assert len(bulk) // 4 > 8192  # over the default max_batch_tokens by the host's estimate
    sa = hosts["standalone"].call("POST", BASE, bulk, {"Content-Type": JSON})
    ra = ray.call("POST", BASE, bulk, {"Content-Type": JSON})
    assert ra.status == sa.status == 200
    assert np.max(np.abs(vectors(ra) - vectors(sa))) <= 1e-6


def test_ray_is_ready_only_after_the_warm_up_pass(ray_host):
    """Asked from its first listening moment while it loads: not ready (Ray's proxy before the application's
    routes, then our ingress's 503 while the model's replica opens and warms up); ready once a replica has run its
    warm-up pass."""
    seen = ray_host.readiness
    print(f"\nreadiness while loading: {sorted(set(seen))}, {len(seen) // 2} asks")
    assert seen and seen[-2] == ("health", 200), seen[-6:]
    assert all(status != 200 for route, status in seen[:-2] if route == "health"), seen
    assert ("health", 503) in seen, seen[:6]  # our ingress asked while the model's replica loaded: not ready
    assert ray_host.warmed_at_ready >= 1  # the replica's ready line ("warmed up (1 pass, ...)") came first


def test_ray_refuses_a_missing_or_wrong_token_and_serves_probes(ray_host):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        reply = request(ray_host.url + BASE, "POST", j({"text": "a"}), {"Content-Type": JSON, **headers})
        assert reply.status == 401 and reply.headers.get("www-authenticate") == "Bearer"
        assert reply.json()["type"] == "InvalidKeyException"
    assert request(ray_host.url + "/v2/health/live").json() == {"live": True}
    assert request(ray_host.url + "/v2/health/ready").json() == {"ready": True}
    meta = request(ray_host.url + "/v2", headers=ray_host.headers()).json()
    assert meta["name"] == "bucketing-ray"
    assert json.loads(request(ray_host.url + f"/v2/models/{NAME}/ready", headers=ray_host.headers()).body) == {
        "name": NAME,
        "ready": True,
    }


def test_ray_metrics_show_the_queue_signals_back_to_zero_after_load(ray_host):
    """`GET /metrics` on the ingress: the standalone host's queue series (`bucketing.metrics.signal_names`), summed
    over the model's replicas, back to 0 once the load is answered (the replicas push every PUSH_S)."""
    url, headers = ray_host.url, ray_host.headers()
    with ThreadPoolExecutor(8) as pool:
        replies = list(
            pool.map(
                lambda i: request(url + BASE, "POST", j({"text": f"text {i}"}), {"Content-Type": JSON, **headers}),
                range(16),
            )
        )
    assert [r.status for r in replies] == [200] * 16
    wanted = signal_names() - {CAPACITY}  # capacity only when handler.capacity_tokens_per_s is set
    deadline = time.monotonic() + 15
    while True:
        reply = request(url + "/metrics", headers=headers)
        assert reply.status == 200, reply.body[:300]
        text = reply.body.decode()
        values = {
            line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("bucket_") and f'ModelName="{NAME}"' in line and "le=" not in line
        }
        settled = values.get("bucket_queue_seconds_count", 0) >= 16 and not any(values.get(g) for g in QUEUE_GAUGES)
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert wanted <= {line.split("{")[0] for line in text.splitlines() if line.startswith("bucket_")}, text
    assert settled, text
    assert values.get("bucket_requests_total", 0) >= 16, text  # the handler's counters, summed likewise


def test_ray_queue_gauge_follows_a_step_load(ray_host):
    """`tests/e2e/test_lifecycle.py`'s step load (light, about 3x capacity, light) on the Ray host (1 replica, batch
    8): at each scrape of the ingress's `/metrics`, `bucket_queue_requests + bucket_inflight_requests` is never
    above what the generator has outstanding, at the median within one batch of it (the requests waiting in Ray's
    router counted: `batching.at_ingress`), short by more than two in at most 5% of the scrapes (requests still in
    Ray's HTTP proxy, which the ingress cannot see: 3 of 230 here, by up to 49), and everything returns to 0."""
    from tests.e2e.test_lifecycle import Load, check_step_load, scrape, step_load

    headers = {**ray_host.headers(), "Content-Type": JSON}
    load = Load(ray_host.url + BASE, headers)
    try:  # 1 s of overload: what queues stays under the router's 256 (a 503 past it)
        capacity, scrapes = step_load(load, lambda: scrape(ray_host.url, headers, NAME), overload_s=1.0)
    finally:
        load.close()
    seen = check_step_load(load, scrapes)
    final = scrape(ray_host.url, headers, NAME)
    assert final["bucket_queue_requests"] == 0 and final["bucket_inflight_requests"] == 0, final
    # the config's fixed count held under 3x overload (`fix_replicas`: the code's autoscaling off)
    assert not scaled_lines(ray_host.temp_dir), scaled_lines(ray_host.temp_dir)
    print(f"Ray step load: capacity {capacity:.1f} req/s (closed loop), {seen}")


def test_ray_stop_under_steady_load_cuts_no_admitted_request(ray_host):
    """Last here (it stops the module's cluster): steady closed-loop load, then what `make stop` runs, the ingress's
    drain and the head's SIGTERM: every request admitted before the drain is answered 200, later ones get 503 with
    Retry-After (or find the port closed), none is cut, and every Ray process is gone after (the fixture checks)."""
    from tests.e2e.test_lifecycle import Load

    load = Load(ray_host.url + BASE, {**ray_host.headers(), "Content-Type": JSON}, threads=8)
    try:
        load.closed_loop(8, lambda: False)  # until each is told 503 or finds the port closed
        time.sleep(2.0)
        started = time.monotonic()
        drained = ray_host.drain(30.0)
        took = time.monotonic() - started
        ray_host.stop()
    finally:
        load.close()
    assert drained, ray_host.tail()
    assert load.cut == [], load.cut[:3]
    assert set(load.statuses) <= {200, 503} and load.statuses[200] > 0 and load.no_retry_after == 0, load.statuses
    assert load.statuses[503] + load.refused == 8, (load.statuses, load.refused)
    print(f"Ray drained stop under load: {dict(load.statuses)}, {load.refused} refused, 0 cut, drain {took:.2f} s")
