"""The autoscaling signals and the lifecycle on real servers (loopback, bounded): on the standalone host,
readiness only after the warm-up pass, `bucket_queue_requests` against what a load generator has waiting under a
step load (light, about 3x capacity, light), and SIGTERM under steady load (every admitted request answered 200,
none cut, exit 0 within the grace period); on TorchServe, `tsctl`'s drained stop under steady load and the
exporter's `bucket_queue_requests` (`python -m tsctl.exporter`)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from tsctl import Endpoints, TorchServe, free_ports, request
from tsctl.exporter import Exporter
from tsctl.served import ServedFolder
from tsctl.standalone import Standalone

pytestmark = pytest.mark.e2e
NAME = "batch"
JSON = "application/json"
BATCH = 8  # the standalone server's batch size here: "within one batch" is this many requests
GRACE_S = 10.0
BODY = json.dumps({"text": "a short sentence to embed, the same for every request of the load"}).encode()


def scrape(url: str, headers: dict[str, str], name: str = NAME) -> dict[str, float]:
    """The model's `bucket_*` series without other labels, by name."""
    series = re.compile(r'^(bucket_\w+)\{ModelName="' + re.escape(name) + r'"\} (\S+)$')
    text = request(url + "/metrics", headers=headers, timeout=10).text
    return {m[1]: float(m[2]) for m in map(series.match, text.splitlines()) if m}


@dataclass
class Load:
    """A load generator that counts what it has outstanding: sent and not yet answered (each request in its own
    thread, counted from just before it is sent to just after its answer is read)."""

    url: str
    headers: dict[str, str]
    threads: int = 256
    outstanding: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    no_retry_after: int = 0  # 503s without Retry-After
    refused: int = 0  # connections refused: never admitted (the server had closed its port)
    cut: list[str] = field(default_factory=list)  # anything else that is not an answer
    lock: threading.Lock = field(default_factory=threading.Lock)
    pool: ThreadPoolExecutor | None = None

    def __post_init__(self) -> None:
        self.pool = ThreadPoolExecutor(self.threads)

    def one(self) -> int | None:
        with self.lock:
            self.outstanding += 1
        try:
            reply = request(self.url, "POST", BODY, self.headers, timeout=120)
        except ConnectionRefusedError:
            with self.lock:
                self.refused += 1
            return None
        except OSError as e:
            with self.lock:
                self.cut.append(repr(e))
            return None
        finally:
            with self.lock:
                self.outstanding -= 1
        with self.lock:
            self.statuses[reply.status] += 1
            if reply.status == 503 and "retry-after" not in reply.headers:
                self.no_retry_after += 1
        return reply.status

    def open_loop(self, rate: float, seconds: float, cap: int) -> int:
        """Arrivals at `rate` per second for `seconds` (at most `cap` of them), not waiting for answers; how many."""
        assert self.pool is not None
        start, sent = time.monotonic(), 0
        while sent < cap and (due := start + sent / rate) < start + seconds:
            time.sleep(max(0.0, due - time.monotonic()))
            self.pool.submit(self.one)
            sent += 1
        return sent

    def closed_loop(self, clients: int, until: Callable[[], bool]) -> None:
        """`clients` threads each sending its next request when its last is answered, until `until()` or a 503 or
        refusal (a client that is told to go elsewhere goes)."""
        assert self.pool is not None

        def client() -> None:
            while not until():
                if self.one() in (None, 503):
                    return

        for _ in range(clients):
            self.pool.submit(client)

    def close(self) -> None:
        assert self.pool is not None
        self.pool.shutdown(wait=True)


@dataclass
class Started:
    server: Standalone
    readiness: list[tuple[str, int]]  # (route, status) asked while it loaded, up to its first "ready"
    log_when_ready: str


def readiness_while_starting(
    server: ServedFolder, name: str, starting: threading.Thread, order: tuple[str, ...]
) -> list[tuple[str, int]]:
    """`/v2/health/ready` ("health") and `/v2/models/NAME/ready` ("model", with the key once the server wrote it),
    asked in `order` every 20 ms from the server's first listening moment until health answers 200 (or the start's
    thread ends with nothing listening): each (route, status) seen."""
    paths = {"health": "/v2/health/ready", "model": f"/v2/models/{name}/ready"}
    seen: list[tuple[str, int]] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            keyed = server.headers() if server.key_file.exists() else {}
            asked = [
                (route, request(server.url + paths[route], headers=keyed if route == "model" else {}, timeout=5).status)
                for route in order
            ]
        except ConnectionError:
            if not starting.is_alive():  # the start failed (and stopped what it launched): nothing will listen
                break
            time.sleep(0.02)
            continue
        seen += asked
        if ("health", 200) in asked:
            break
        time.sleep(0.02)
    return seen


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, model_store) -> Iterator[Started]:
    """A standalone server (1 worker, batch 8) whose readiness routes were asked from its first listening moment
    until the first 200, and its log at that moment."""
    workdir: Path = tmp_path_factory.mktemp("lifecycle")
    server = Standalone(workdir, free_ports(1)[0])
    source = ["--archive", str(model_store / "minilm-bucketed.mar"), "--name", NAME]
    extra = ["--batch-size", str(BATCH), "--workers", "1", "--max-batch-delay", "5", "--queue-size", "2000"]
    extra += ["--grace-period", str(GRACE_S)]
    starting = threading.Thread(target=server.start, args=(source, extra), daemon=True)
    starting.start()
    try:
        seen = readiness_while_starting(server, NAME, starting, ("model", "health"))
        log = server.log.read_text(errors="replace") if seen and seen[-1] == ("health", 200) else ""
        starting.join(300)
        yield Started(server, seen, log)
    finally:  # also on an interrupt while it starts: the start's thread ends once its server has
        while starting.is_alive():
            server.stop()
            starting.join(1.0)
        server.stop()


def test_standalone_is_ready_only_after_the_warm_up_pass(standalone: Started):
    seen = standalone.readiness
    assert ("health", 503) in seen and ("model", 503) in seen, seen[:6]  # asked while it loaded: not ready
    assert seen[-1] == ("health", 200)
    assert "warmed up (1 pass," in standalone.log_when_ready  # the worker's ready line, before the first yes


@dataclass
class History:
    """What a load generator had outstanding, sampled every 10 ms in a thread of its own: the least and most over a
    span of time (a scrape of values up to `stale_s` old is compared with the span they may have been read in)."""

    load: Load
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=100_000))
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stop.wait(0.01):
            self.samples.append((time.monotonic(), self.load.outstanding))

    def span(self, start: float, end: float, *also: int) -> tuple[int, int]:
        seen = [n for t, n in list(self.samples) if start <= t <= end] + list(also)
        return min(seen), max(seen)


def step_load(
    load: Load, read: Callable[[], dict[str, float]], stale_s: float = 0.0, overload_s: float = 2.0
) -> tuple[float, list[tuple]]:
    """Capacity (a closed loop of 2 batches of clients for 3 s), then light (0.3x, 2 s), about 3x capacity for
    `overload_s` (about 2x capacity x `overload_s` requests queue) and light again (2 s), open loop; scraped
    (`read`) every 0.1 s until all is answered and the gauges read 0 for 0.5 s past their staleness. Each scrape:
    (least outstanding, queued, tokens, in flight, most outstanding), outstanding over the span from `stale_s`
    before the scrape to its end. The capacity in req/s, and the scrapes."""
    stop_at = time.monotonic() + 3.0
    before = sum(load.statuses.values())
    load.closed_loop(2 * BATCH, lambda: time.monotonic() > stop_at)
    time.sleep(3.5)
    capacity = (sum(load.statuses.values()) - before) / 3.0
    assert capacity > 0
    history = History(load)
    scrapes: list[tuple] = []
    phases = [(0.3 * capacity, 2.0), (3.0 * capacity, overload_s), (0.3 * capacity, 2.0)]
    done = threading.Event()

    def drive() -> None:
        for rate, seconds in phases:
            load.open_loop(rate, seconds, cap=600)
        done.set()

    driver = threading.Thread(target=drive)
    driver.start()
    quiet_since = None
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            started, before_read = time.monotonic(), load.outstanding
            got = read()
            lo, hi = history.span(started - stale_s, time.monotonic(), before_read, load.outstanding)
            queued, tokens, inflight = (got["bucket_queue_requests"], got["bucket_queue_tokens"],
                                        got["bucket_inflight_requests"])  # fmt: skip
            scrapes.append((lo, queued, tokens, inflight, hi))
            if done.is_set() and hi == 0 and queued == 0 and inflight == 0:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 0.5 + stale_s:
                    break
            else:
                quiet_since = None
            time.sleep(0.1)
    finally:
        driver.join(60)
        history.stop.set()
    return capacity, scrapes


SHORT_SHARE = 0.05  # scrapes that may fall short by more than two batches: the instants a host (or the generator)
# lags on 2 cores it shares with the generator and CI's other tier (the standalone host, in one CI run: 1 of 64
# scrapes, 238 counted against 256 outstanding), or requests still sit in a hop before the queue (Ray's proxy)


def check_step_load(load: Load, scrapes: list[tuple], short_share: float = SHORT_SHARE, over_by: int = 0) -> str:
    """Never more than the generator had outstanding (but by `over_by`); never short of it by more than the batch
    that just finished (answered, its replies not yet read by the generator) and the batch being admitted (sent, not
    yet queued), but in `short_share` of the scrapes; at the median scrape within one. Everything answered; the
    step was an overload. A line saying what was seen."""
    assert load.cut == [] and set(load.statuses) == {200}, (load.cut[:3], load.statuses)
    peak = max(q for _, q, *_ in scrapes)
    assert peak >= 3 * BATCH, f"the overload step queued at most {peak} requests"
    over = [s for s in scrapes if s[1] + s[3] > s[4] + over_by]
    short = [s for s in scrapes if s[1] + s[3] < s[0] - 2 * BATCH]
    assert not over and len(short) <= short_share * len(scrapes), (over[:5], short[:5], len(scrapes))
    shortfalls = sorted(max(0.0, lo - (q + f)) for lo, q, _, f, hi in scrapes)
    assert shortfalls[len(shortfalls) // 2] <= BATCH, shortfalls
    return (
        f"{len(scrapes)} scrapes, peak queue {peak:.0f}, median shortfall {shortfalls[len(shortfalls) // 2]:.0f}, "
        f"{len(short)} short by more than 2 batches, largest shortfall {shortfalls[-1]:.0f} (batch {BATCH})"
    )


def test_queue_gauge_follows_a_step_load_within_one_batch(standalone: Started):
    """Light, then about 3x capacity, then light: at each scrape `bucket_queue_requests + bucket_inflight_requests`
    is never above what the generator has outstanding (before and after the scrape), never short of it by more than
    two batches (one answered and unread, one sent and not yet admitted) and, at the median scrape, within one; tokens
    are the requests' estimate, and everything returns to 0."""
    server = standalone.server
    headers = {**server.headers(), "Content-Type": JSON}
    load = Load(server.url + f"/predictions/{NAME}", headers)
    tokens_each = len(BODY) // 4
    try:
        capacity, scrapes = step_load(load, lambda: scrape(server.url, headers))
    finally:
        load.close()
    seen = check_step_load(load, scrapes)
    assert all(t == q * tokens_each for _, q, t, _, _ in scrapes)
    final = scrape(server.url, headers)
    assert final["bucket_queue_requests"] == 0 and final["bucket_inflight_requests"] == 0
    assert final["bucket_queue_tokens"] == 0 and final["bucket_queue_seconds_count"] > 0
    print(f"step load: capacity {capacity:.1f} req/s (closed loop), {seen}")


def test_sigterm_under_steady_load_loses_nothing(standalone: Started):
    """Steady closed-loop load, SIGTERM: every request the server admitted is answered 200, the rest get 503 with
    Retry-After (or find the port closed), none is cut, and the process exits 0 within the grace period."""
    server = standalone.server
    headers = {**server.headers(), "Content-Type": JSON}
    load = Load(server.url + f"/predictions/{NAME}", headers, threads=16)
    assert server.process is not None
    try:
        load.closed_loop(12, lambda: False)  # until each is told 503 or finds the port closed
        time.sleep(2.0)
        sent = time.monotonic()
        server.process.send_signal(15)
        code = server.process.wait(GRACE_S + 5)
        exited = time.monotonic() - sent
    finally:
        load.close()
    assert code == 0, server.tail()
    assert exited < GRACE_S, exited
    assert load.cut == [], load.cut[:3]
    assert set(load.statuses) <= {200, 503} and load.statuses[200] > 0 and load.no_retry_after == 0, load.statuses
    assert "drain: every admitted request answered" in server.tail(40)
    print(f"SIGTERM under load: {dict(load.statuses)}, {load.refused} refused, 0 cut, exit 0 after {exited:.2f} s")


@pytest.fixture
def own_torchserve(tmp_path, model_store) -> Iterator[TorchServe]:
    """A TorchServe of this test's own (it is stopped under load), `NAME` on 1 worker of batch 8."""
    server = TorchServe(tmp_path / "ts", Endpoints.on_ports(*free_ports(3)), model_store=model_store)
    server.start()
    try:
        server.client.register("minilm-bucketed.mar", NAME, batch_size=BATCH, max_batch_delay=5, workers=1)
        yield server
    finally:
        server.stop()


def test_torchserve_exporter_and_drained_stop_under_steady_load(own_torchserve: TorchServe):
    """TorchServe with the exporter (every 0.2 s): the step load's checks (`check_step_load`, each scrape against
    what was outstanding from 0.3 s before it); then steady load: the exporter reads the frontend's queue
    (`bucket_queue_requests` above 0 while 24 clients share 1 worker of batch 8, its /metrics naming the declared
    series); then the load stops being sent
    (a terminating pod leaves its Service's endpoints) and `stop(drain_s=...)` waits for what was admitted before
    SIGTERM: every request answered 200, none cut, stopped within the grace period."""
    server = own_torchserve
    headers = {**server.client.keys.headers("inference"), "Content-Type": JSON}
    url = server.endpoints.inference + f"/predictions/{NAME}"
    exporter = Exporter(server.client, interval=0.2)
    http = ThreadingHTTPServer(("127.0.0.1", free_ports(1)[0]), exporter.handler())
    threading.Thread(target=http.serve_forever, daemon=True).start()
    threading.Thread(target=exporter.run, daemon=True).start()
    exported = f"http://127.0.0.1:{http.server_address[1]}"
    stepped = Load(url, headers)
    try:  # 1 s of overload: what queues stays under TorchServe's job_queue_size (256)
        capacity, scrapes = step_load(stepped, lambda: scrape(exported, {}), stale_s=0.3, overload_s=1.0)
        # the exporter reads the frontend's pending count and the worker's in-flight gauge at different instants: a
        # batch taken from the queue between the two reads counts twice (a CI run: 94 against 93 outstanding)
        seen = check_step_load(stepped, scrapes, over_by=BATCH)
    except BaseException:
        http.shutdown()
        raise
    finally:
        stepped.close()
    print(f"TorchServe step load (exporter every 0.2 s): capacity {capacity:.1f} req/s, {seen}")
    load = Load(url, headers, threads=32)
    stop_sending = threading.Event()
    peak = 0.0
    try:
        load.closed_loop(24, stop_sending.is_set)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            got = scrape(exported, {})
            peak = max(peak, got.get("bucket_queue_requests", 0.0))
            time.sleep(0.2)
        assert set(got) == {"bucket_queue_requests", "bucket_queue_tokens", "bucket_inflight_requests"}, got
        stop_sending.set()
        started = time.monotonic()
        drained = server.stop(drain_s=GRACE_S)
        took = time.monotonic() - started
    finally:
        stop_sending.set()
        load.close()
        http.shutdown()
    assert peak > 0, "the exporter never saw a request waiting"
    assert drained and took < GRACE_S + 10, took
    assert load.cut == [] and set(load.statuses) == {200}, (load.cut[:3], load.statuses)
    print(f"TorchServe drained stop under load: {dict(load.statuses)}, 0 cut, {took:.2f} s; peak queue {peak:.0f}")
