"""The Ray host on a 3-node local cluster (`ray.cluster_utils.Cluster`: a head and two worker nodes, 1 CPU each, the
workers with one `encoder` slot each, so the model's replicas land on distinct worker nodes), over HTTP:

1. two replicas on two nodes both answer, with the standalone host's bytes (TorchServe's) and within 1e-5 of
   sentence-transformers;
2. a replica SIGKILLed under load: every request answered (200 or a clear 5xx), none hangs, the replica comes back;
3. a worker node removed under load: the same; a new node joins and the replica comes back on it;
4. autoscaling (min 1, max 2): under a step of load a second replica starts on the other node, and after it the
   deployment scales back to one; both times measured and printed.

Opt-in (several minutes): `make ray-test` (RAY_CLUSTER_TEST=1), output kept in config/ray/sample/ray-test.txt.
The HTTP proxy runs on the head only (`proxy_location: HeadOnly`): every node of this cluster is this machine, so
per-node proxies would all want the same port."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.test_hosts import BASE, CASES, JSON, NAME, Host, j, start_standalone, unique
from tsctl import free_ports, request

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.ray_cluster,
    pytest.mark.skipif(not os.environ.get("RAY_CLUSTER_TEST"), reason="opt-in: make ray-test (RAY_CLUSTER_TEST=1)"),
]
APP = "bucketing"
OBJECT_STORE = 150 * 1024 * 1024
SCALING = {
    "min_replicas": 1,
    "max_replicas": 2,
    "target_ongoing_requests": 2,
    "upscale_delay_s": 2.0,
    "downscale_delay_s": 10.0,
    "look_back_period_s": 12.0,
}
WORKER: dict[str, Any] = {
    "num_cpus": 1,
    "object_store_memory": 150 * 1024 * 1024,
    "resources": {"encoder": 1},
}
RAY_TMPDIR = f"/tmp/bucketing-raytest-{os.getpid()}"  # Ray's folders under it, not /tmp/ray (short: socket paths)
STATE: dict[str, object] = {}  # the deployed host's port and key file, for the update of test_4
HARD_LIMIT_S = 180.0  # any wait for the cluster past this fails the test


def log(message: str) -> None:
    print(f"[ray-test {time.strftime('%H:%M:%S')}] {message}", flush=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head + two worker nodes; torn down on every path (Ray's reaper ends them should this process die)."""
    tmp = tmp_path_factory.mktemp("ray-cluster")
    token = tmp / "ray_auth_token"
    token.write_text(os.urandom(32).hex())
    token.chmod(0o600)
    os.makedirs(RAY_TMPDIR, exist_ok=True)
    os.environ.update(
        {
            "RAY_TMPDIR": RAY_TMPDIR,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
    import ray
    from ray.cluster_utils import Cluster

    port, client, agent, dashboard = free_ports(4)
    head = {
        "num_cpus": 1,
        "object_store_memory": OBJECT_STORE,
        "include_dashboard": True,  # Ray's state API (where each replica runs) is served by the dashboard
        "dashboard_host": "127.0.0.1",
        "dashboard_port": dashboard,
        "gcs_server_port": port,
        "ray_client_server_port": client,
        "dashboard_agent_listen_port": agent,
    }
    made = Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(2):
            made.add_node(**WORKER)
        ray.init(address=made.address)
        log(f"cluster up: head + 2 worker nodes at {made.address}")
        yield made
    finally:
        from ray import serve

        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            made.shutdown()
            shutil.rmtree(RAY_TMPDIR, ignore_errors=True)
            log("cluster shut down")


def deploy(url_port: int, key_file: Path, model_store: Path, scaling: dict) -> None:
    from ray import serve

    from bucketing.hosts.ray.app import build

    serve.start(http_options={"host": "127.0.0.1", "port": url_port}, proxy_location="HeadOnly")
    model = {
        "model": str((model_store / "minilm-bucketed.mar").resolve()),
        "name": NAME,
        "threads": 1,
        "batch_size": 8,
        "max_batch_delay_ms": 100,
        "ray_actor_options": {"resources": {"encoder": 1}},
        "autoscaling_config": scaling,
    }
    serve.run(build({"models": [model], "key_file": str(key_file)}), name=APP, route_prefix="/")


def replicas() -> list[dict]:
    """The model's replicas as Ray's state API reports them (alive ones), with their node."""
    from ray.util.state import list_actors

    actors = list_actors(filters=[("class_name", "=", f"ServeReplica:{APP}:{NAME}"), ("state", "=", "ALIVE")])
    return [{"actor_id": a.actor_id, "node_id": a.node_id, "pid": a.pid} for a in actors]


def running() -> int:
    from ray import serve

    status = serve.status().applications[APP].deployments[NAME]
    return sum(int(n) for state, n in status.replica_states.items() if state == "RUNNING")


def wait_for(what: str, check, limit: float = HARD_LIMIT_S) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if check():
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {limit:.0f} s")


def where_all(calls: int = 40) -> dict[str, dict]:
    """Each replica's `where()` (pid, node, answered so far), by actor id, from repeated handle calls."""
    import ray  # noqa: F401
    from ray import serve

    handle = serve.get_deployment_handle(NAME, APP)
    seen: dict[str, dict] = {}
    for _ in range(calls):
        info = handle.where.remote().result(timeout_s=30)
        seen[info["actor_id"]] = info
    return seen


class Load:
    """`clients` threads posting requests until stopped; every outcome counted (status, or the exception of a
    request that got no HTTP answer within `timeout`: a hang)."""

    def __init__(self, host: Host, clients: int, timeout: float = 60.0) -> None:
        self.host, self.timeout = host, timeout
        self.outcomes: Counter[str] = Counter()
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, index: int) -> None:
        n = 0
        while not self.stop_event.is_set():
            body = j({"texts": [f"client {index} request {n} about bucketing", "a second text"]})
            try:
                reply = request(
                    self.host.url + BASE,
                    "POST",
                    body,
                    {**self.host.headers, "Content-Type": JSON},
                    timeout=self.timeout,
                )
                outcome = str(reply.status)
            except Exception as e:  # noqa: BLE001 - counted: no answer at all
                outcome = f"no answer ({type(e).__name__})"
            with self.lock:
                self.outcomes[outcome] += 1
            n += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(self.timeout + 10)
        assert not any(t.is_alive() for t in self.threads), "a client thread hung"


def check_outcomes(outcomes: Counter[str]) -> None:
    assert outcomes, "no request was sent"
    bad = {k: v for k, v in outcomes.items() if not (k == "200" or (k.isdigit() and 500 <= int(k) < 600))}
    assert not bad, f"requests without a 200 or a 5xx: {bad} (all: {dict(outcomes)})"


@pytest.fixture(scope="module")
def ray_host(cluster, tmp_path_factory, model_store) -> Host:
    port = free_ports(1)[0]
    key_file = tmp_path_factory.mktemp("ray-key") / "key_file.json"
    started = time.monotonic()
    STATE.update(port=port, key_file=key_file)
    deploy(port, key_file, model_store, {**SCALING, "min_replicas": 2})
    wait_for("two replicas running", lambda: running() == 2)
    log(f"deployed with 2 replicas in {time.monotonic() - started:.1f} s")
    from bucketing.hosts.standalone.__main__ import read_key

    return Host("ray", f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {read_key(key_file)}"})


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, model_store):
    server = start_standalone(tmp_path_factory.mktemp("standalone-for-cluster"), model_store)
    try:
        yield Host("standalone", server.url, server.headers())
    finally:
        assert server.stop() == 0, server.tail()


def test_1_replicas_on_two_nodes_answer_as_torchserve(ray_host, standalone):
    placed = replicas()
    nodes = {r["node_id"] for r in placed}
    log(f"replicas: {len(placed)} on {len(nodes)} nodes")
    assert len(placed) == 2 and len(nodes) == 2
    for case, method, path, body, headers in CASES:
        sa = standalone.call(method, path, body, headers)
        ra = ray_host.call(method, path, body, headers)
        assert (ra.status, ra.headers.get("content-type"), unique(ra.body)) == (
            sa.status,
            sa.headers.get("content-type"),
            unique(sa.body),
        ), case
    import sentence_transformers

    from model_store.archives import minilm_dir

    texts = ["short query", "a somewhat longer passage about bucketing requests by length"]
    expected = sentence_transformers.SentenceTransformer(str(minilm_dir()), device="cpu").encode(texts)
    with Load(ray_host, 6) as load:
        time.sleep(4)
    check_outcomes(load.outcomes)
    seen = where_all()
    answered = {info["node_id"][:8]: info["served"] for info in seen.values()}
    log(f"after {sum(load.outcomes.values())} requests under load: answered per node {answered}")
    assert len(answered) == 2 and all(n > 0 for n in answered.values())
    got = np.array(
        [row["embedding"] for row in ray_host.call("POST", BASE, j({"texts": texts}), {"Content-Type": JSON}).json()]
    )
    assert np.max(np.abs(got - expected)) <= 1e-5
    log(f"{len(CASES)} cases equal to the standalone host's bytes; within 1e-5 of sentence-transformers")


def test_2_a_replica_killed_under_load(ray_host):
    before = replicas()
    victim = before[0]
    with Load(ray_host, 6) as load:
        time.sleep(3)
        os.kill(victim["pid"], signal.SIGKILL)  # a process of the cluster this test started
        killed = time.monotonic()
        log(f"SIGKILLed replica pid {victim['pid']} on node {victim['node_id'][:8]}")
        # back: a new replica (another actor) answering through the handle, beside the survivor
        back = wait_for(
            "the replica back",
            lambda: (
                running() == 2 and len(answering := set(where_all(20))) == 2 and victim["actor_id"] not in answering
            ),
        )
        time.sleep(3)
    log(f"replica back after {back:.1f} s; outcomes {dict(load.outcomes)} ({time.monotonic() - killed:.1f} s)")
    check_outcomes(load.outcomes)
    assert len({r["node_id"] for r in replicas()}) == 2


def test_3_a_worker_node_lost_under_load(cluster, ray_host):
    import ray

    placed = replicas()
    victim_node = placed[0]["node_id"]
    node = next(n for n in cluster.worker_nodes if n.node_id == victim_node)
    with Load(ray_host, 6) as load:
        time.sleep(3)
        cluster.remove_node(node, allow_graceful=False)
        lost = time.monotonic()
        log(f"removed worker node {victim_node[:8]} (its raylet and replica killed)")
        wait_for("one replica left serving", lambda: running() >= 1, 60)
        time.sleep(5)
        cluster.add_node(**WORKER)
        log("a new worker node joined")
        back = wait_for("two replicas again", lambda: running() == 2 and len({r["node_id"] for r in replicas()}) == 2)
        time.sleep(3)
    log(f"replica back on the new node {time.monotonic() - lost:.1f} s after the loss; outcomes {dict(load.outcomes)}")
    check_outcomes(load.outcomes)
    assert victim_node not in {r["node_id"] for r in replicas()}
    assert len([n for n in ray.nodes() if n["Alive"]]) == 3
    del back


def test_4_autoscaling_up_and_down(ray_host, model_store):
    # the same application with min_replicas 1: an options-only update (no replica restarts)
    port, key_file = STATE["port"], STATE["key_file"]
    assert isinstance(port, int) and isinstance(key_file, Path)
    deploy(port, key_file, model_store, SCALING)
    idle = wait_for("scaled down to one replica while idle", lambda: running() == 1 and len(replicas()) == 1)
    log(f"idle: down to 1 replica in {idle:.1f} s after the update")
    first = {r["node_id"] for r in replicas()}
    with Load(ray_host, 12) as load:
        step = time.monotonic()
        up = wait_for("scaled up to two replicas under load", lambda: running() == 2)
        time.sleep(2)
    nodes = {r["node_id"] for r in replicas()}
    log(f"scale-up: 2 replicas RUNNING {up:.1f} s after the step of load (12 clients); outcomes {dict(load.outcomes)}")
    check_outcomes(load.outcomes)
    assert len(nodes) == 2 and nodes != first
    calm = time.monotonic()
    down = wait_for("scaled back down to one replica", lambda: running() == 1 and len(replicas()) == 1)
    log(f"scale-down: 1 replica {down:.1f} s after the load stopped ({calm - step:.1f} s of load)")
