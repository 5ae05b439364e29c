"""The standalone host in process, on a fake worker: the batcher's closing rules (a fake clock), admission (queue
full, draining), continuous batching's pending requests, and the app's authorization, limits, timeouts, metrics."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

from bucketing.config import HandlerConfig
from bucketing.hosts.answers import QUIET_S
from bucketing.hosts.standalone.app import App, Settings
from bucketing.hosts.standalone.batcher import Batcher, Draining, Job, QueueFull, fill
from bucketing.hosts.standalone.models import ModelSpec
from bucketing.metrics import METRICS, BatchStats
from bucketing.protocols.base import Reply


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def eventually(condition: Callable[[], bool], within_s: float = 30.0) -> None:
    """Wait until `condition` holds (what a worker thread does takes as long as the machine's load makes it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        assert loop.time() < deadline, "never came true"
        await asyncio.sleep(0.01)


def job(tokens: int = 1, arrived: float = 0.0, done: bool = False) -> Job:
    future: asyncio.Future[Any] = asyncio.get_event_loop_policy().new_event_loop().create_future()
    if done:
        future.cancel()
    return Job(None, tokens, arrived, "k", future)


def test_a_batch_closes_at_batch_size_requests():
    queue = deque(job() for _ in range(5))
    batch: list[Job] = []
    tokens, closed = fill(batch, 0, queue, batch_size=4, max_tokens=1000)
    assert (len(batch), tokens, closed, len(queue)) == (4, 4, True, 1)


def test_a_batch_closes_before_the_request_that_would_pass_max_batch_tokens():
    queue = deque([job(300), job(300), job(500), job(10)])
    batch: list[Job] = []
    tokens, closed = fill(batch, 0, queue, batch_size=16, max_tokens=1000)
    assert (len(batch), tokens, closed, len(queue)) == (2, 600, True, 2)


def test_a_request_over_max_batch_tokens_is_a_batch_alone_and_dropped_requests_never_run():
    queue = deque([job(5000), job(1)])
    batch: list[Job] = []
    assert fill(batch, 0, queue, 16, 1000) == (5000, True) and len(batch) == 1
    queue = deque([job(done=True), job(3)])
    batch = []
    assert fill(batch, 0, queue, 16, 1000) == (3, False) and len(batch) == 1 and not queue


def batcher(serve=None, **kw) -> Batcher:
    args: dict[str, Any] = {
        "workers": 1,
        "batch_size": 2,
        "max_delay_s": 0.05,
        "max_batch_tokens": 1000,
        "queue_size": 8,
    }
    args.update(kw)
    return Batcher(serve=serve or (lambda worker, jobs: [j.payload for j in jobs]), **args)


def test_a_request_waits_at_most_the_delay_measured_from_its_arrival():
    async def run() -> None:
        clock = Clock()
        b = batcher(clock=clock, max_delay_s=10.0)
        first = b.submit("a", 1)
        clock.now += 11.0  # it waited past the delay while no worker was free: its batch closes at once
        assert await asyncio.wait_for(b.collect(), 1.0) == [first]
        second = b.submit("b", 1)  # a fresh one waits for company until its own deadline (fake: never here)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(b.collect(), 0.2)
        assert second.started is False

    asyncio.run(run())


def test_a_request_waits_for_company_only_while_no_other_worker_is_free():
    """With two workers free a request goes at once (the delay would only hold it back); while the other worker is
    busy it waits for company, and goes as soon as that worker is free."""
    release = threading.Event()
    seen: list[list[str]] = []

    def serve(worker: int, jobs: list[Job]) -> list[str]:
        seen.append([j.payload for j in jobs])
        if jobs[0].payload == "first":
            release.wait(5.0)
        return [j.payload for j in jobs]

    async def run() -> None:
        clock = Clock()  # frozen: the delay (10 s) never passes
        b = batcher(serve, workers=2, batch_size=4, max_delay_s=10.0, clock=clock)
        b.start()
        first = b.submit("first", 1)
        await eventually(lambda: seen == [["first"]])  # a worker thread runs it, however busy the machine
        assert first.started  # both workers were free: it went at once, alone
        second = b.submit("second", 1)
        await asyncio.sleep(0.2)
        assert not second.started  # the other worker is busy: it waits for company
        release.set()
        assert await asyncio.wait_for(second.future, 2.0) == "second"  # that worker came free: it went
        assert await first.future == "first" and seen == [["first"], ["second"]]
        await b.close()

    asyncio.run(run())


def test_batches_close_by_count_then_by_delay_and_every_request_is_answered():
    seen: list[list[str]] = []

    def serve(worker: int, jobs: list[Job]) -> list[str]:
        seen.append([j.payload for j in jobs])
        return [f"answer {j.payload}" for j in jobs]

    async def run() -> list[str]:
        b = batcher(serve)
        jobs = [b.submit(p, 1) for p in "abcde"]
        b.start()
        answers = await asyncio.gather(*(j.future for j in jobs))
        await b.close()
        return list(answers)

    assert asyncio.run(run()) == [f"answer {p}" for p in "abcde"]
    assert seen == [["a", "b"], ["c", "d"], ["e"]]


def test_a_full_queue_and_a_draining_batcher_refuse_at_once():
    async def run() -> None:
        b = batcher(queue_size=2)
        b.submit("a", 1), b.submit("b", 1)
        with pytest.raises(QueueFull, match="2 requests are already waiting"):
            b.submit("c", 1)
        b.start()
        assert await b.drain(5.0)  # the two admitted are answered
        with pytest.raises(Draining):
            b.submit("d", 1)
        await b.close()

    asyncio.run(run())


def test_a_pending_request_is_served_again_on_its_worker():
    calls: list[list[str]] = []

    def serve(worker: int, jobs: list[Job]) -> list[str | None]:
        calls.append([j.payload for j in jobs])
        return [None if j.payload == "long" and len(calls) == 1 else j.payload for j in jobs]

    async def run() -> list[str]:
        b = batcher(serve, batch_size=4, max_delay_s=0.0)
        jobs = [b.submit("long", 1), b.submit("short", 1)]
        b.start()
        answers = await asyncio.gather(*(j.future for j in jobs))
        await b.close()
        return list(answers)

    assert asyncio.run(run()) == ["long", "short"]
    assert calls[0] == ["long", "short"] and calls[1][0] == "long"


def test_a_pending_bulk_request_does_not_shut_new_requests_out():
    """A pending request over the token budget goes on with the requests that arrived meanwhile (counted by
    requests: the worker's pool serves it a slice a call), not alone until it is done."""
    calls: list[list[str]] = []
    first_call = threading.Event()
    small_sent = threading.Event()

    def serve(worker: int, jobs: list[Job]) -> list[str | None]:
        calls.append([j.payload for j in jobs])
        first_call.set()
        small_sent.wait(5.0)  # the small request arrives while the bulk one's first slice runs
        return [None if j.payload == "bulk" and len(calls) < 3 else j.payload for j in jobs]

    async def run() -> list[str]:
        b = batcher(serve, batch_size=4, max_delay_s=0.0, max_batch_tokens=100)
        bulk = b.submit("bulk", 5000)
        b.start()
        await asyncio.get_running_loop().run_in_executor(None, first_call.wait, 5.0)
        small = b.submit("small", 10)
        small_sent.set()
        answers = await asyncio.gather(bulk.future, small.future)
        await b.close()
        return list(answers)

    assert asyncio.run(run()) == ["bulk", "small"]
    assert calls == [["bulk"], ["bulk", "small"], ["bulk"]]  # before: the bulk alone, then the small one


# -- the app --------------------------------------------------------------------------------------------------
class FakeWorker:
    """Answers each row with its body echoed; `gate` (when set) holds every call until it is opened."""

    pool = None
    task = None

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate

    def ready_line(self) -> str:
        return "fake ready"

    def serve(self, rows, metas, keys, name):
        if self.gate is not None:
            self.gate.wait(10)

        def got(row: dict[str, Any]) -> Any:
            body = row.get("body")
            return body.decode() if isinstance(body, bytes) else body

        replies = [Reply(200, json.dumps({"got": got(r), "path": m.url_path})) for r, m in zip(rows, metas)]
        return replies, BatchStats(requests=len(rows), texts=len(rows))


def spec(**kw) -> ModelSpec:
    base: dict[str, Any] = {"name": "m", "version": "1.0", "model_dir": "/x", "config": HandlerConfig()}
    base.update(kw)
    return ModelSpec(**base)


async def call(app: App, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None):
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": method, "path": path, "headers": raw}
    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    await app(scope, receive, send)
    head = dict((k.decode(), v.decode()) for k, v in sent[0]["headers"])
    return sent[0]["status"], head, sent[1]["body"]


KEYED = Settings(key="k")


def app_with(worker: FakeWorker, settings: Settings = KEYED, **kw) -> App:
    return App([spec(**kw)], settings, lambda s, cost: worker)


AUTH = {"Authorization": "Bearer k", "Content-Type": "application/json"}


def test_the_app_serves_with_the_key_and_refuses_without_it():
    async def run() -> None:
        app = app_with(FakeWorker())
        await app.start()
        assert await app.loaded()
        status, head, body = await call(app, "POST", "/predictions/m/1.0/v1/embeddings", b'{"input": "a"}', AUTH)
        assert status == 200 and json.loads(body) == {"got": {"input": "a"}, "path": "v1/embeddings"}
        status, head, body = await call(app, "POST", "/predictions/m", b"{}", {"Authorization": "Bearer nope"})
        assert status == 401 and json.loads(body)["type"] == "InvalidKeyException" and head["www-authenticate"]
        for probe in ("/v2/health/live", "/v2/health/ready", "/ping"):  # probes need no key
            assert (await call(app, "GET", probe))[0] == 200
        assert (await call(app, "GET", "/metrics"))[0] == 401
        status, head, body = await call(app, "GET", "/metrics", headers=AUTH)
        text = body.decode()
        assert status == 200 and head["content-type"].startswith("text/plain; version=0.0.4")
        assert all(f'{name}{{ModelName="m"}}' in text for name in METRICS)
        assert 'bucket_requests_total{ModelName="m"} 1' in text and "bucket_request_ms_bucket{" in text
        await app.stop()

    asyncio.run(run())


def test_a_body_over_the_limit_is_a_413_before_any_work():
    async def run() -> None:
        app = app_with(FakeWorker(), Settings(key=None, max_request_bytes=10))
        await app.start()
        await app.loaded()
        status, _, body = await call(app, "POST", "/predictions/m", b"x" * 11)
        assert status == 413 and "over 10 bytes" in json.loads(body)["message"]
        await app.stop()

    asyncio.run(run())


def test_a_full_queue_is_a_503_with_retry_after_never_a_hang():
    async def run() -> None:
        gate = threading.Event()
        app = app_with(FakeWorker(gate), Settings(key=None, queue_size=1), batch_size=1, max_batch_delay_ms=0.0)
        await app.start()
        await app.loaded()
        running = asyncio.create_task(call(app, "POST", "/predictions/m", b"a"))  # taken by the worker, held
        await asyncio.sleep(0.1)
        queued = asyncio.create_task(call(app, "POST", "/predictions/m", b"b"))  # the one place in the queue
        await asyncio.sleep(0.05)
        status, head, body = await asyncio.wait_for(call(app, "POST", "/predictions/m", b"c"), 1.0)
        assert status == 503 and head["retry-after"] == "1" and "queue is full" in json.loads(body)["message"]
        gate.set()
        assert [r[0] for r in await asyncio.gather(running, queued)] == [200, 200]
        await app.stop()

    asyncio.run(run())


def test_the_request_timeout_is_a_504_while_running_and_a_503_while_queued():
    async def run() -> None:
        gate = threading.Event()
        settings = Settings(key=None, request_timeout_s=0.3)
        app = app_with(FakeWorker(gate), settings, batch_size=1, max_batch_delay_ms=0.0)
        await app.start()
        await app.loaded()
        running = asyncio.create_task(call(app, "POST", "/predictions/m", b"a"))
        await asyncio.sleep(0.1)
        queued = asyncio.create_task(call(app, "POST", "/predictions/m", b"b"))
        first, second = await asyncio.wait_for(asyncio.gather(running, queued), 5.0)
        assert first[0] == 504 and "not answered within 0.3 s" in json.loads(first[2])["message"]
        assert second[0] == 503 and "waited 0.3 s in the queue" in json.loads(second[2])["message"]
        gate.set()
        await app.stop()

    asyncio.run(run())


async def draining(gate: threading.Event, admitted: int) -> tuple[App, list[asyncio.Task[Any]], asyncio.Task[bool]]:
    """An app on one worker held by `gate`, `admitted` requests sent to it, then its drain begun."""
    app = app_with(FakeWorker(gate), Settings(key=None), batch_size=1, max_batch_delay_ms=0.0)
    await app.start()
    await app.loaded()
    sent = [asyncio.create_task(call(app, "POST", "/predictions/m", b"x")) for _ in range(admitted)]
    await asyncio.sleep(0.1)
    drained = asyncio.create_task(app.drain())
    await asyncio.sleep(0.05)
    return app, sent, drained


def test_draining_refuses_new_requests_and_answers_the_admitted():
    async def run() -> None:
        gate = threading.Event()
        app, admitted, drained = await draining(gate, 3)
        status, head, _ = await call(app, "POST", "/predictions/m", b"late")
        assert status == 503 and head["retry-after"] == "1"
        assert (await call(app, "GET", "/v2/health/ready"))[0] == 503  # a balancer stops sending here
        gate.set()
        assert await drained and [r[0] for r in await asyncio.gather(*admitted)] == [200, 200, 200]
        await app.stop()

    asyncio.run(run())


def test_after_the_drain_newcomers_are_told_503_until_none_came_for_the_quiet_time():
    """A client answered at the drain's end that sends again at once gets a 503, not a closed port."""

    async def run() -> None:
        gate = threading.Event()
        app, (admitted,), drained = await draining(gate, 1)
        gate.set()
        assert (await admitted)[0] == 200
        assert not drained.done()  # the drain is over, the quiet time is not
        status, head, _ = await call(app, "POST", "/predictions/m", b"again")
        late = asyncio.get_running_loop().time()
        assert status == 503 and head["retry-after"] == "1"
        assert await drained and asyncio.get_running_loop().time() - late >= QUIET_S
        await app.stop()

    asyncio.run(run())


def test_a_model_that_fails_to_open_is_unhealthy():
    def fail(spec: ModelSpec, cost: Any) -> Any:
        raise OSError("no such folder")

    async def run() -> None:
        app = App([spec()], Settings(key=None), fail)
        await app.start()
        assert not await app.loaded() and "no such folder" in (app.failed or "")
        assert (await call(app, "GET", "/v2/health/ready"))[0] == 503
        assert (await call(app, "POST", "/predictions/m", b"x"))[0] == 503
        await app.stop()

    asyncio.run(run())


def test_not_ready_while_the_worker_opens_and_warms_up():
    """`worker.open` runs the warm-up pass before it returns: until then both ready routes say no and a request is
    a 503 with Retry-After; once it returns, they say yes."""
    opening = threading.Event()

    def slow_open(s: ModelSpec, cost: Any) -> Any:
        opening.wait(10)
        return FakeWorker()

    async def run() -> None:
        app = App([spec()], Settings(key=None), slow_open)
        await app.start()
        await asyncio.sleep(0.05)
        for path in ("/v2/health/ready", "/v2/models/m/ready"):
            status, _, body = await call(app, "GET", path)
            assert status == 503 and json.loads(body)["ready"] is False, path
        status, head, _ = await call(app, "POST", "/predictions/m", b"x")
        assert status == 503 and head["retry-after"] == "1"
        opening.set()
        assert await app.loaded()
        for path in ("/v2/health/ready", "/v2/models/m/ready"):
            assert (await call(app, "GET", path))[0] == 200, path
        await app.stop()

    asyncio.run(run())


def test_only_the_first_worker_of_a_model_calibrates_the_others_take_its_cost_model():
    """Workers open one after another; the first is given no cost model (it calibrates one), each later one is
    given the first's: one calibration per model, not one per worker, in the cold start."""
    given: list[Any] = []

    def opener(s: ModelSpec, cost: Any) -> Any:
        given.append(cost)
        worker = FakeWorker()
        worker.cost = cost if cost is not None else ("fitted", len(given))  # type: ignore[attr-defined]
        return worker

    async def run() -> None:
        app = App([spec(workers=3)], Settings(key=None), opener)
        await app.start()
        assert await app.loaded()
        await app.stop()

    asyncio.run(run())
    assert given == [None, ("fitted", 1), ("fitted", 1)]


def test_metrics_carry_the_queue_signals_while_requests_wait_and_run():
    async def run() -> None:
        gate = threading.Event()
        config = HandlerConfig(capacity_tokens_per_s=2000.0)
        app = app_with(FakeWorker(gate), Settings(key=None), batch_size=1, max_batch_delay_ms=0.0, config=config)
        await app.start()
        await app.loaded()
        calls = [asyncio.create_task(call(app, "POST", "/predictions/m", b"x" * 40)) for _ in range(3)]
        await asyncio.sleep(0.1)  # one taken by the worker (held at the gate), two waiting

        def read() -> dict[str, float]:
            text = app.registry.render((), app.signals())
            return {k: float(v) for k, _, v in (line.rpartition(" ") for line in text.splitlines() if line[0] != "#")}

        got = read()
        m = '{ModelName="m"}'
        assert got[f"bucket_queue_requests{m}"] == 2 and got[f"bucket_queue_tokens{m}"] == 20  # 40 bytes / 4 each
        assert got[f"bucket_inflight_requests{m}"] == 1 and got[f"bucket_capacity_tokens_per_second{m}"] == 2000
        assert got['bucket_queue_seconds_count{ModelName="m"}'] == 1
        gate.set()
        assert [r[0] for r in await asyncio.gather(*calls)] == [200, 200, 200]
        got = read()
        assert got[f"bucket_queue_requests{m}"] == 0 and got[f"bucket_inflight_requests{m}"] == 0
        assert got[f"bucket_queue_tokens{m}"] == 0 and got[f"bucket_queue_seconds_count{m}"] == 3
        await app.stop()

    asyncio.run(run())
