"""TorchServe's queue as the autoscaling signals, for a pod's metrics port: `python -m tsctl.exporter --config PATH`.

The handler cannot see TorchServe's queue (the frontend, a JVM, holds it), so this small process reads it where it
lives, every `--interval` seconds (5 by default): the management API's `GET /models` and `GET /models/NAME` (TorchServe
0.12's `jobQueueStatus.pendingRequests`: jobs in the model's queue, not yet taken into a batch), and the metrics
API's `/metrics` (the frontend's `ts_inference_requests_total` counts arrivals, the handler's
`bucket_requests_total` and `bucket_real_tokens_total` what it answered). It serves, per model (`ModelName`), the
series the standalone host serves under the same names (`bucketing.metrics`):

- `bucket_queue_requests`: `pendingRequests`, exact at the poll;
- `bucket_queue_tokens`: an estimate, `pendingRequests` x the mean real tokens per answered request so far
  (the tokens of waiting requests are not known before the handler tokenizes them);
- `bucket_inflight_requests`: an estimate, arrivals - answered - pending, at most READY workers x batchSize (a
  request the frontend refused, 503 of a full queue, stays in the difference: it reads high after refusals).

`bucket_queue_seconds` has no counterpart (TorchServe keeps the sum of queue times only,
`ts_queue_latency_microseconds`), nor does `bucket_capacity_tokens_per_second` here: the handler emits it on
TorchServe's own /metrics. Each value is at most one interval (plus the poll, a few ms) old. `drain` (what `tsctl
stop` runs before SIGTERM) waits on the same figures.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bucketing.metrics import INFLIGHT, QUEUE_REQUESTS, QUEUE_TOKENS, Sample

from .client import Client, Endpoints, read_properties

DEFAULT_PORT = 9108
LINE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line of Prometheus' text format."""
    for line in text.splitlines():
        if line.startswith("#") or not (m := LINE.match(line)):
            continue
        try:
            value = float(m[3])
        except ValueError:
            continue
        yield m[1], dict(LABEL.findall(m[2] or "")), value


def per_model(text: str, name: str, label: str) -> dict[str, float]:
    """A series' values summed by model (the `label` naming it: `model_name` for the frontend's, `ModelName` for
    the handler's)."""
    out: dict[str, float] = {}
    for series, labels, value in parse(text):
        if series == name and label in labels:
            out[labels[label]] = out.get(labels[label], 0.0) + value
    return out


@dataclass(frozen=True)
class ModelQueue:
    """One model's figures at a poll."""

    pending: int  # jobQueueStatus.pendingRequests
    ready_workers: int
    batch_size: int
    arrivals: float  # ts_inference_requests_total
    answered: float  # bucket_requests_total
    real_tokens: float  # bucket_real_tokens_total

    @property
    def tokens_per_request(self) -> float:
        return self.real_tokens / self.answered if self.answered else 0.0

    @property
    def inflight(self) -> float:
        unanswered = self.arrivals - self.answered - self.pending
        return max(0.0, min(unanswered, float(self.ready_workers * self.batch_size)))

    def samples(self, name: str) -> list[Sample]:
        labels = (("ModelName", name),)
        return [
            (QUEUE_REQUESTS, "gauge", labels, float(self.pending)),
            (QUEUE_TOKENS, "gauge", labels, round(self.pending * self.tokens_per_request, 1)),
            (INFLIGHT, "gauge", labels, self.inflight),
        ]


def poll(client: Client, timeout: float = 5.0) -> dict[str, ModelQueue]:
    """Every registered model's queue now: 1 + (models) management calls and one metrics scrape."""
    text = client.metrics()
    arrivals = per_model(text, "ts_inference_requests_total", "model_name")
    answered = per_model(text, "bucket_requests_total", "ModelName")
    tokens = per_model(text, "bucket_real_tokens_total", "ModelName")
    out = {}
    for name in client.models():
        reply = client.call("management", "GET", f"/models/{urllib.parse.quote(name)}", timeout=timeout)
        if reply.status != 200:
            continue
        described = reply.json()[0]
        workers = [w.get("status") for w in described.get("workers", [])]
        out[name] = ModelQueue(
            pending=int(described.get("jobQueueStatus", {}).get("pendingRequests", 0)),
            ready_workers=workers.count("READY"),
            batch_size=int(described.get("batchSize", 1)),
            arrivals=arrivals.get(name, 0.0),
            answered=answered.get(name, 0.0),
            real_tokens=tokens.get(name, 0.0),
        )
    return out


def render(queues: dict[str, ModelQueue]) -> str:
    """The text exposition format (0.0.4) of every model's signals."""
    by_name: dict[str, list[str]] = {}
    for model, queue in sorted(queues.items()):
        for name, _kind, labels, value in queue.samples(model):
            shown = ",".join(f'{k}="{v}"' for k, v in labels)
            by_name.setdefault(name, []).append(f"{name}{{{shown}}} {value:g}")
    return "".join(f"# TYPE {n} gauge\n" + "\n".join(lines) + "\n" for n, lines in by_name.items())


def drain(
    client: Client,
    grace_s: float,
    quiet_s: float = 2.0,
    poll_s: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait (at most `grace_s`) until no model has a request waiting and its figures (arrivals, answers, pending)
    have not moved for `quiet_s`: what was admitted is answered. TorchServe cannot refuse new requests while it
    keeps serving (no pause; scaling to 0 workers kills the running batch; its SIGTERM closes every connection), so
    this only ends well once nothing sends any more (Kubernetes takes a terminating pod out of its Service's
    endpoints). Set `quiet_s` above the handler's longest batch. Whether it drained."""
    deadline = clock() + grace_s
    last: object = None
    since = clock()
    while clock() < deadline:
        try:
            queues = poll(client)
        except OSError:
            return True  # nothing answers: nothing left to wait for
        figures = sorted((n, q.pending, q.arrivals, q.answered) for n, q in queues.items())
        if figures != last or any(q.pending for q in queues.values()):
            last, since = figures, clock()
        elif clock() - since >= quiet_s:
            return True
        sleep(poll_s)
    return False


class Exporter:
    """The last poll, refreshed every `interval` seconds by a daemon thread, served at `/metrics`."""

    def __init__(self, client: Client, interval: float) -> None:
        self.client = client
        self.interval = interval
        self.text = ""
        self.error = "not polled yet"

    def refresh(self) -> None:
        try:
            self.text, self.error = render(poll(self.client)), ""
        except (OSError, ValueError) as e:
            self.error = f"{type(e).__name__}: {e}"

    def run(self) -> None:
        while True:
            started = time.monotonic()
            self.refresh()
            time.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def handler(self) -> type[BaseHTTPRequestHandler]:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                ok = not exporter.error
                body = (exporter.text if ok else f"# {exporter.error}\n").encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
                return

        return Handler


def client_for(config: Path, key_file: Path | None) -> Client:
    props = read_properties(config)
    auth_off = props.get("disable_token_authorization", "false").lower() == "true"
    return Client(Endpoints.from_properties(props), None if auth_off else key_file)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tsctl.exporter", description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="TorchServe's config.properties (its API addresses)")
    p.add_argument("--key-file", type=Path, help="TorchServe's key_file.json, when token authorization is on")
    p.add_argument("--host", default="0.0.0.0", help="address to serve /metrics on (default: every address)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--interval", type=float, default=5.0, help="seconds between polls of TorchServe")
    args = p.parse_args(argv)
    exporter = Exporter(client_for(args.config, args.key_file), args.interval)
    exporter.refresh()
    threading.Thread(target=exporter.run, daemon=True, name="poll").start()
    server = ThreadingHTTPServer((args.host, args.port), exporter.handler())
    print(f"tsctl.exporter: http://{args.host}:{args.port}/metrics, polling every {args.interval:g} s", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
