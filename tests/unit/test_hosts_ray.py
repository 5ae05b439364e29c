"""The Ray host without a cluster: the token estimate, the replicas' queue signals summed per model, the HTTP
answers of `front.Front` with fake models, the application's args, and
the copy of config/ray/serve.yaml `make serve-ray` deploys."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from bucketing.hosts.answers import QUIET_S, SHUTTING_DOWN, Answer
from bucketing.hosts.ray.batching import Item, Pending, estimate_tokens, model_signals, summed
from bucketing.hosts.ray.front import METRICS_MESSAGE, Front, Limits
from bucketing.metrics import CAPACITY, QueueSignals, signal_names
from tsctl.ray import CONFIG, is_our_ray, ray_temp_dir, serve_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_token_estimate_is_body_bytes_over_four():
    assert estimate_tokens(b"x" * 41) == 10


def test_replicas_signals_are_summed_per_model():
    """Two replicas' `QueueSignals` as one model's series (the standalone host's names and label); capacity is one
    replica's; a model no replica reported shows zeros."""
    one, two = QueueSignals(900.0), QueueSignals(900.0)
    for signals, waits in ((one, (0.002, 0.3)), (two, (0.002,))):
        for waited in waits:
            signals.admitted(10)
            signals.started(10, waited)
    two.admitted(4)
    got = {(n, labels): v for n, _, labels, v in summed([one.samples(), two.samples()], (("ModelName", "m"),))}
    m = (("ModelName", "m"),)
    assert got[("bucket_queue_requests", m)] == 1 and got[("bucket_queue_tokens", m)] == 4
    assert got[("bucket_inflight_requests", m)] == 3 and got[(CAPACITY, m)] == 900.0
    assert got[("bucket_queue_seconds_count", m)] == 3
    assert got[("bucket_queue_seconds_bucket", (*m, ("le", "0.005")))] == 2
    assert {n for n, _ in got} == signal_names()
    empty = model_signals(["m", "other"], {"m": [one.samples()]})
    zeros = {n: v for n, _, labels, v in empty if labels == (("ModelName", "other"),)}
    assert zeros["bucket_queue_requests"] == zeros["bucket_inflight_requests"] == 0


def test_the_gauges_count_what_the_ingress_holds_not_only_what_replicas_were_given():
    """Ray's router gives a replica at most `max_ongoing_requests`; the rest wait in the router, unseen by the
    replicas. The ingress's pending count is the total; the replicas' in-flight figure splits it (clamped: it may be
    up to a push old), and the waiting ones' tokens are their share; the histogram stays the replicas'."""
    replica = QueueSignals()
    for _ in range(16):  # what the router gave the replica: 8 running, 8 queued
        replica.admitted(10)
    for _ in range(8):
        replica.started(10, 0.01)
    m = (("ModelName", "m"),)

    def gauges(pending: Pending) -> dict[str, float]:
        got = model_signals(["m"], {"m": [replica.samples()]}, {"m": pending})
        return {n: v for n, _, labels, v in got if labels == m}

    seen = gauges(Pending(requests=100, tokens=1000))  # 84 more in the router's queue
    assert seen["bucket_queue_requests"] == 92 and seen["bucket_inflight_requests"] == 8
    assert seen["bucket_queue_tokens"] == 920 and seen["bucket_queue_seconds_count"] == 8
    stale = gauges(Pending(requests=3, tokens=30))  # the replica's figure is older than the ingress's count
    assert stale["bucket_queue_requests"] == 0 and stale["bucket_inflight_requests"] == 3
    idle = gauges(Pending())
    assert idle["bucket_queue_requests"] == idle["bucket_queue_tokens"] == idle["bucket_inflight_requests"] == 0


class Receiver:
    def __init__(self, body: bytes) -> None:
        self.chunks = [body]

    async def __call__(self):
        chunk = self.chunks.pop(0) if self.chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": False}


def front(key: str | None = "secret", delay: float = 0.0, timeout: float = 5.0, ready: bool = True) -> Front:
    async def predict(name: str, it: Item) -> Answer:
        await asyncio.sleep(delay)
        return Answer(200, json.dumps({"model": name, "url_path": it.url_path, "tokens": it.tokens}).encode())

    async def is_ready(name: str) -> bool:
        return ready

    return Front({"m": "1.0", "other": "2.0"}, predict, is_ready, Limits(key, 100, timeout))


def call(f: Front, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Answer:
    return asyncio.run(f.answer(method, path, headers or {}, Receiver(body)))


AUTH = {"authorization": "Bearer secret"}


def test_front_authorizes_like_the_standalone_host():
    f = front()
    refused = call(f, "POST", "/predictions/m", b"{}")
    assert refused.status == 401 and ("WWW-Authenticate", "Bearer") in refused.headers
    assert json.loads(refused.body)["type"] == "InvalidKeyException"
    assert call(f, "POST", "/predictions/m", b"{}", {"authorization": "Bearer wrong"}).status == 401
    assert call(f, "GET", "/ping").status == 200  # probes: no token
    assert call(f, "GET", "/v2/health/ready").status == 200
    assert call(front(key=None), "POST", "/predictions/m", b"{}").status == 200


def test_front_routes_to_the_worker_with_torchserves_url_path():
    f = front()
    answer = call(f, "POST", "/predictions/m/1.0/v1/embeddings", b'{"input": "a"}', AUTH)
    assert json.loads(answer.body) == {"model": "m", "url_path": "v1/embeddings", "tokens": 3}
    assert json.loads(call(f, "POST", "/v2/models/m/infer", b"{}", AUTH).body)["url_path"] is None
    # a root OpenAI route with several models: the body's model picks one
    assert json.loads(call(f, "POST", "/v1/embeddings", b'{"model": "other"}', AUTH).body)["model"] == "other"
    assert call(f, "POST", "/predictions/nope", b"{}", AUTH).status == 404
    assert json.loads(call(f, "POST", "/predictions/m/9.9", b"{}", AUTH).body)["type"] == (
        "ModelVersionNotFoundException"
    )
    assert call(f, "DELETE", "/metrics", b"", AUTH).status == 405
    metrics = call(f, "GET", "/metrics", b"", AUTH)
    assert metrics.status == 404 and json.loads(metrics.body)["message"] == METRICS_MESSAGE


def test_front_serves_the_metrics_it_is_given():
    async def text() -> str:
        return 'bucket_queue_requests{ModelName="m"} 0\n'

    f = Front({"m": "1.0"}, front().predict, front().ready, Limits("secret"), text)
    reply = call(f, "GET", "/metrics", b"", AUTH)
    assert reply.status == 200 and reply.body.startswith(b"bucket_queue_requests")
    assert reply.content_type.startswith("text/plain")


def test_front_limits_body_timeout_and_readiness():
    f = front()
    too_big = call(f, "POST", "/predictions/m", b"x" * 101, AUTH)
    assert too_big.status == 413 and json.loads(too_big.body)["type"] == "RequestEntityTooLarge"
    slow = call(front(delay=60, timeout=0.05), "POST", "/predictions/m", b"{}", AUTH)
    assert slow.status == 504 and ("Retry-After", "1") in slow.headers
    not_ready = front(ready=False)
    assert call(not_ready, "GET", "/v2/health/ready").status == 503
    assert json.loads(call(not_ready, "GET", "/v2/models/m/ready", b"", AUTH).body) == {"name": "m", "ready": False}


def test_front_drains_answering_what_it_admitted_and_turning_newcomers_away():
    """`Front.drain` (before the head's SIGTERM): a prediction admitted before it is answered 200; one arriving
    during it gets the standalone host's 503 with Retry-After, readiness says no, ping stays 200; the drain ends
    once the admitted one is answered and no newcomer came for `QUIET_S`; a prediction still running when its time
    is up makes it answer False."""
    release = asyncio.Event()

    async def held(name: str, it: Item) -> Answer:
        await release.wait()
        return Answer(200, b"{}")

    async def is_ready(name: str) -> bool:
        return True

    async def scenario() -> None:
        f = Front({"m": "1.0"}, held, is_ready, Limits(None))
        admitted = asyncio.create_task(f.answer("POST", "/predictions/m", {}, Receiver(b"{}")))
        while f.in_flight == 0:
            await asyncio.sleep(0)
        drain = asyncio.create_task(f.drain(30.0))
        await asyncio.sleep(0)
        late = await f.answer("POST", "/predictions/m", {}, Receiver(b"{}"))
        assert late.status == 503 and ("Retry-After", "1") in late.headers
        assert json.loads(late.body)["message"] == SHUTTING_DOWN
        assert (await f.answer("GET", "/v2/health/ready", {}, Receiver(b""))).status == 503
        assert (await f.answer("GET", "/v2/models/m/ready", {}, Receiver(b""))).status == 503
        assert (await f.answer("GET", "/ping", {}, Receiver(b""))).status == 200
        assert not drain.done() and f.in_flight == 1
        release.set()
        assert (await admitted).status == 200
        answered_at = asyncio.get_running_loop().time()
        assert await drain is True and f.in_flight == 0
        assert asyncio.get_running_loop().time() - answered_at >= QUIET_S * 0.9

        stuck = Front({"m": "1.0"}, lambda name, it: asyncio.sleep(60, Answer(200, b"")), is_ready, Limits(None))
        running = asyncio.create_task(stuck.answer("POST", "/predictions/m", {}, Receiver(b"{}")))
        while stuck.in_flight == 0:
            await asyncio.sleep(0)
        assert await stuck.drain(0.1) is False and stuck.in_flight == 1
        running.cancel()

    asyncio.run(scenario())


def test_app_args_are_checked():
    from bucketing.hosts.ray.args import AppArgs, ArgsError

    with pytest.raises(ArgsError, match="models"):
        AppArgs.parse({})
    with pytest.raises(ArgsError, match="absolute"):
        AppArgs.parse({"models": [{"model": "relative.mar"}]})
    with pytest.raises(ArgsError, match="unknown"):
        AppArgs.parse({"models": [{"model": "/m.mar"}], "colour": 1})
    with pytest.raises(ArgsError, match="keys"):
        AppArgs.parse({"models": [{"model": "/m.mar", "workers": 2}]})
    parsed = AppArgs.parse({"models": [{"model": "/m.mar", "threads": 2}], "no_auth": True})
    assert parsed.models[0].threads == 2 and parsed.no_auth


def test_shipped_config_names_the_application():
    config = yaml.safe_load(CONFIG.read_text())
    app = config["applications"][0]
    assert app["import_path"] == "bucketing.hosts.ray.app:build" and app["route_prefix"] == "/"
    assert app["args"]["models"][0]["name"] == "minilm-bucketed"
    scaling = next(d for d in app["deployments"] if d["name"] == "minilm-bucketed")["autoscaling_config"]
    assert scaling["min_replicas"] < scaling["max_replicas"] and scaling["target_ongoing_requests"] > 0
    from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(config)  # Ray's own schema of `serve deploy` files


def test_serve_config_for_this_machine(tmp_path):
    base = yaml.safe_load(CONFIG.read_text())
    archive = tmp_path / "x.mar"
    config = serve_config(base, archive, "batch", 12345, tmp_path / "key.json", threads=2)
    app = config["applications"][0]
    assert config["http_options"]["host"] == "127.0.0.1" and config["http_options"]["port"] == 12345
    assert app["args"]["models"][0] == {"model": str(archive.resolve()), "name": "batch", "threads": 2}
    assert app["args"]["key_file"] == str((tmp_path / "key.json").resolve())
    assert "batch" in [d["name"] for d in app["deployments"]]
    assert base["applications"][0]["args"]["models"][0]["name"] == "minilm-bucketed"  # the base is not changed
    open_config = serve_config(base, archive, "batch", 1, None)
    assert open_config["applications"][0]["args"]["no_auth"] is True
    assert "key_file" not in open_config["applications"][0]["args"]


def test_ray_identity_refuses_other_processes(tmp_path):
    import os

    assert not is_our_ray(os.getpid(), tmp_path)  # pytest is not a Ray head
    temp = ray_temp_dir(tmp_path)
    assert temp == ray_temp_dir(tmp_path) and temp != ray_temp_dir(tmp_path / "other")
    assert len(str(temp)) < 60  # Ray's socket paths (its temp folder + ~60 bytes) must fit 107 bytes


def test_nothing_below_hosts_imports_the_ray_host():
    handler = ROOT / "handler"
    for path in handler.rglob("*.py"):
        if "hosts" in path.relative_to(handler).parts:
            continue
        text = path.read_text()
        assert "hosts.ray" not in text and "import ray" not in text, path


def test_the_head_drains_for_our_time_not_rays_30_s(tmp_path):
    """Our head holds the replicas and never goes idle: Ray's default drain on SIGTERM (30 s) was waited out whole."""
    from tsctl.ray import NODE_DRAIN_S, RayServe

    assert RayServe(tmp_path).ray_env()["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == f"{NODE_DRAIN_S:g}"
    assert RayServe(tmp_path, node_drain_s=0.5).ray_env()["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0.5"


def test_make_stop_drains_the_ray_ingress_before_the_heads_sigterm(capsys):
    """`make stop` (`tsctl stop`): the Ray host's ingress is drained with TorchServe's drain time, then the head is
    stopped, drained or not (saying so)."""
    from tsctl.__main__ import stop

    calls: list[tuple[object, ...]] = []

    class FakeTorchServe:
        def pid(self) -> None:
            return None

        def stop(self, drain_s: float) -> bool:
            calls.append(("torchserve", drain_s))
            return True

    class FakeRay:
        log = Path("ray.out")

        def pid(self) -> int:
            return 42

        def drain(self, drain_s: float) -> bool:
            calls.append(("drain", drain_s))
            return False

        def stop(self) -> None:
            calls.append(("stop",))

    assert stop(FakeTorchServe(), "bucketed", None, FakeRay(), 25.0) == 0  # type: ignore[arg-type]
    assert calls == [("torchserve", 25.0), ("drain", 25.0), ("stop",)]
    assert "did not drain in 25 s" in capsys.readouterr().out
