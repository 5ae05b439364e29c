"""The standalone server's ASGI app: the shared route table (`hosts.routes`) over one batcher per model, each
request handed to the worker as TorchServe would hand it (`hosts.rows`), so every answer is the handler's own.

Around the worker: bearer-token authorization (`Authorization: Bearer KEY`; the health probes exempt), a body limit
(413), a bounded queue (503 with `Retry-After`), a per-request timeout (503 while still queued, 504 once running),
a drain on SIGTERM (503 with `Retry-After` for new requests, every admitted one answered), Prometheus text at
`/metrics`, and one JSON log line per request. The errors the host answers itself are TorchServe's JSON shape
(`{"code", "type", "message"}`, indented as TorchServe's frontend writes it).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bucketing.hosts import routes
from bucketing.hosts.answers import (
    EXEMPT,
    RETRY_AFTER_S,
    TOKEN_MESSAGE,
    Answer,
    Drain,
    Receive,
    Scope,
    Send,
    body_model,
    not_served,
    read_body,
    reply_answer,
    send_answer,
    ts_error,
    unavailable,
)
from bucketing.hosts.rows import torchserve_row
from bucketing.hosts.standalone.batcher import Batcher, Job, QueueFull, Refused
from bucketing.hosts.standalone.models import ModelSpec
from bucketing.hosts.standalone.prometheus import CONTENT_TYPE as METRICS_TYPE
from bucketing.hosts.standalone.prometheus import Registry
from bucketing.metrics import QueueSignals, Sample

logger = logging.getLogger("bucketing.hosts.standalone")
access = logging.getLogger("bucketing.hosts.standalone.access")

BYTES_PER_TOKEN = 4  # the batcher's token estimate: body bytes / 4 (English WordPiece/BPE; JSON overhead included)


@dataclass(frozen=True)
class Settings:
    """The host's own limits and key (the model's settings are its `ModelSpec`)."""

    key: str | None = None  # None: no authorization
    max_request_bytes: int = 8 * 1024 * 1024  # TorchServe's max_request_size in config/config.properties
    queue_size: int = 256  # per model: TorchServe's job_queue_size in config/config.properties
    request_timeout_s: float | None = None  # None: the model-config's responseTimeout
    grace_period_s: float = 30.0  # SIGTERM to exit at most: Kubernetes' default terminationGracePeriodSeconds
    drain_timeout_s: float | None = None  # None: the grace period less SHUTDOWN_S (the rest: closing connections)
    max_batch_tokens: int | None = None  # None: the model's handler.max_batch_tokens


SHUTDOWN_S = 3.0  # of the grace period, what the server keeps for closing connections after the drain


@dataclass
class Served:
    """One model on this host: its spec, its opened workers (by index) and its batcher."""

    spec: ModelSpec
    batcher: Batcher
    workers: list[Any] = field(default_factory=list)
    ready: bool = False


def serve_jobs(
    worker: Any, name: str, jobs: Sequence[Job], row: Callable[[Any], tuple[Any, Any]]
) -> tuple[list[Answer | None], Any]:
    """One `Worker.serve` call on a batcher's jobs (in the worker's thread): each job's answer (None: pending under a
    continuous schedule, sent again), and the call's figures. `row(payload)`: its TorchServe row and metadata, made
    once per job and kept while it is pending."""
    for job in jobs:
        if job.prepared is None:
            job.prepared = row(job.payload)
    keys = [job.key for job in jobs] if getattr(worker, "pool", None) is not None else None
    replies, stats = worker.serve([job.prepared[0] for job in jobs], [job.prepared[1] for job in jobs], keys, name)
    return [None if r is None else reply_answer(r) for r in replies], stats


class App:
    """The ASGI app over the served models."""

    def __init__(self, specs: Sequence[ModelSpec], settings: Settings, opener: Callable[[ModelSpec, Any], Any]) -> None:
        self.settings = settings
        # opens one worker of a spec (in the worker's own thread), given the cost model of the model's first worker
        # (None for the first, which calibrates one)
        self.opener = opener
        self.registry = Registry()
        self.models: dict[str, Served] = {}
        self.failed: str | None = None  # why a model could not be opened
        self.stopping = Drain()
        self.answered: dict[int, int] = {}
        for spec in specs:
            batcher = Batcher(
                serve=self._serve_for(spec.name),
                workers=spec.workers,
                batch_size=spec.batch_size,
                max_delay_s=spec.max_batch_delay_ms / 1000.0,
                max_batch_tokens=settings.max_batch_tokens or spec.config.max_batch_tokens,
                queue_size=settings.queue_size,
                signals=QueueSignals(spec.config.capacity_tokens_per_s),
            )
            self.models[spec.name] = Served(spec, batcher, [None] * spec.workers)
        self.versions = {name: m.spec.version for name, m in self.models.items()}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loading: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return not self.stopping.draining and all(m.ready for m in self.models.values())

    async def start(self) -> None:
        """Start the batchers and open every model's workers in the background (readiness says when done)."""
        self._loop = asyncio.get_running_loop()
        for served in self.models.values():
            served.batcher.start()
        self._loading = asyncio.create_task(self._open_all())

    async def _open_all(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            for served in self.models.values():
                # One after another, each in its own worker's thread: imports (transformers' lazy modules) are not
                # thread-safe. The first calibrates the cost model (on cores no other worker is using); the others
                # take it: the same config on the same cores, so a second calibration would fit the same model
                # again and add about 2 s each to the cold start.
                cost = None
                for i in range(served.spec.workers):
                    executor = served.batcher.executor(i)
                    served.workers[i] = await loop.run_in_executor(executor, self.opener, served.spec, cost)
                    cost = getattr(served.workers[i], "cost", None)
                logger.info("%s", served.workers[0].ready_line())  # logged before readiness says yes
                logger.info(
                    "model %s READY: %d worker(s) x %d thread(s), batch %d, delay %g ms",
                    served.spec.name,
                    served.spec.workers,
                    served.spec.config.torch_threads,
                    served.spec.batch_size,
                    served.spec.max_batch_delay_ms,
                )
                served.ready = True  # every worker opened and warmed up (`worker.open`)
        except Exception as e:  # noqa: BLE001 - reported in one line; the server exits with it
            self.failed = f"{type(e).__name__}: {e}"
            logger.error("model failed to open: %s", self.failed)

    async def loaded(self) -> bool:
        """Wait until every model is opened (or failed); whether all were."""
        if self._loading is not None:
            await self._loading
        return self.failed is None

    async def drain(self) -> bool:
        """SIGTERM: admit nothing more, answer what was admitted; whether all was answered in time.

        Then, within the same time, keep telling newcomers 503 until none came for `QUIET_S` (`Drain.quiet`)."""
        loop = asyncio.get_running_loop()
        self.stopping.draining = True
        deadline = loop.time() + self.drain_s
        results = await asyncio.gather(*(m.batcher.drain(self.drain_s) for m in self.models.values()))
        await self.stopping.quiet(deadline)
        return all(results)

    @property
    def drain_s(self) -> float:
        """How long admitted requests are given on SIGTERM: `drain_timeout_s`, else the grace period less
        `SHUTDOWN_S` (at least 1 s)."""
        given = self.settings.drain_timeout_s
        return given if given is not None else max(1.0, self.settings.grace_period_s - SHUTDOWN_S)

    def signals(self) -> list[Sample]:
        """Every model's queue signals now (`bucketing.metrics.QueueSignals`), labelled by model."""
        return [s for n, m in self.models.items() for s in m.batcher.signals.samples((("ModelName", n),))]

    async def stop(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        for served in self.models.values():
            await served.batcher.close()

    # -- the worker's side (its own thread) ------------------------------------------------------------------
    def _serve_for(self, name: str) -> Callable[[int, Sequence[Job]], list[Answer | None]]:
        def serve(index: int, jobs: Sequence[Job]) -> list[Answer | None]:
            worker = self.models[name].workers[index]
            answers, stats = serve_jobs(worker, name, jobs, lambda payload: torchserve_row(*payload))
            engine = getattr(getattr(worker, "task", None), "engine", None)
            fidelity, shadow = getattr(engine, "fidelity", None), getattr(engine, "shadow", None)
            cosine = fidelity.cosine_min if fidelity is not None else None
            samples = shadow.drain() if shadow is not None else None
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self.registry.record, name, stats, cosine, samples)
            return answers

        return serve

    # -- HTTP --------------------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        method = scope["method"]
        path = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        found = routes.match(method, path, self.versions)
        received = 0
        try:
            answer, received = await self._answer(found, method, headers, receive)
        except Exception:  # a fault of the host itself: logged, answered as TorchServe answers a failed prediction
            logger.exception("%s %s failed", method, path)
            answer = Answer(503, ts_error(503, "InternalServerException", "Prediction failed"))
        await send_answer(send, answer, head=method == "HEAD")
        self.answered[answer.status] = self.answered.get(answer.status, 0) + 1
        access.info(
            "%s",
            json.dumps(
                {
                    "method": method,
                    "path": path,
                    "model": found.model,
                    "status": answer.status,
                    "ms": round((time.perf_counter() - started) * 1000.0, 2),
                    "in": received,
                    "out": len(answer.body),
                }
            ),
        )

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def authorized(self, headers: dict[str, str]) -> bool:
        key = self.settings.key
        if key is None:
            return True
        scheme, _, sent = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(), key.encode())

    async def _answer(
        self, found: routes.Match, method: str, headers: dict[str, str], receive: Receive
    ) -> tuple[Answer, int]:
        if found.action not in EXEMPT and not self.authorized(headers):
            body = ts_error(401, "InvalidKeyException", TOKEN_MESSAGE)
            return Answer(401, body, headers=(("WWW-Authenticate", "Bearer"),)), 0
        if found.action != "predict":
            return self._host_answer(found), 0
        served = self.models[found.model or ""]
        if self.stopping.draining:
            return self.stopping.turn_away(), 0
        if self.failed is not None or not served.ready:
            return unavailable(f'Model "{served.spec.name}" is not ready yet (loading); retry shortly'), 0
        read = await read_body(receive, headers, self.settings.max_request_bytes)
        if read is None:
            limit = self.settings.max_request_bytes
            message = f"the request body is over {limit} bytes (--max-request-bytes); send fewer texts per request"
            return Answer(413, ts_error(413, "RequestEntityTooLarge", message)), 0
        body = read
        if found.by_body:  # a root OpenAI route with several models: the body's `model` names one
            served = self.models.get(body_model(body) or "", served)
        return await self._predict(served, found, headers, body), len(body)

    async def _predict(self, served: Served, found: routes.Match, headers: dict[str, str], body: bytes) -> Answer:
        name = served.spec.name
        try:
            job = served.batcher.submit((body, headers, found.url_path), len(body) // BYTES_PER_TOKEN)
        except QueueFull as e:
            return unavailable(f'Model "{name}": the queue is full, {e.reason}; retry after {RETRY_AFTER_S} s')
        except Refused as e:
            return unavailable(f'Model "{name}": {e.reason}')
        timeout = self.settings.request_timeout_s or served.spec.response_timeout_s
        try:
            answer: Answer = await asyncio.wait_for(asyncio.shield(job.future), timeout)
            return answer
        except TimeoutError:
            if not job.started:
                job.future.cancel()  # never run: the batcher skips it
                return unavailable(
                    f'Model "{name}": the request waited {timeout:g} s in the queue without a free worker '
                    "(the request timeout); retry, or add workers"
                )
            job.future.cancel()
            return unavailable(
                f'Model "{name}": the request was not answered within {timeout:g} s (the request timeout: the '
                "model-config's responseTimeout unless --request-timeout); send fewer or shorter texts per request",
                504,
                "RequestTimeout",
            )

    def _host_answer(self, found: routes.Match) -> Answer:
        action, name = found.action, found.model or ""
        if action == "ping":
            status = "Healthy" if self.failed is None else "Unhealthy"
            body = json.dumps({"status": status}, indent=2).encode() + b"\n"  # TorchServe's, byte for byte
            return Answer(200 if self.failed is None else 500, body)
        if action == "live":
            return Answer(200, b'{"live":true}')
        if action == "ready":
            return Answer(200 if self.ready else 503, json.dumps({"ready": self.ready}, separators=(",", ":")).encode())
        if action == "server_meta":
            meta = {"name": "bucketing-standalone", "version": "0.2.0", "extensions": []}
            return Answer(200, json.dumps(meta, separators=(",", ":")).encode())
        if action in ("model_ready", "model_v1"):
            ready = self.models[name].ready and not self.stopping.draining
            return Answer(200 if ready else 503, json.dumps({"name": name, "ready": ready}).encode())
        if action == "model_v2":
            spec = self.models[name].spec
            meta = {"name": name, "versions": [spec.version], "platform": "bucketing", "inputs": [], "outputs": []}
            return Answer(200, json.dumps(meta).encode())
        if action == "metrics":
            gauges: list[tuple[str, float, tuple[tuple[str, str], ...]]] = []
            for n, m in self.models.items():
                gauges.append(("standalone_queue_depth", float(m.batcher.depth), (("ModelName", n),)))
                gauges.append(("standalone_in_flight", float(m.batcher.in_flight), (("ModelName", n),)))
            gauges += [
                ("standalone_answers", float(c), (("status", str(s)),)) for s, c in sorted(self.answered.items())
            ]
            return Answer(200, self.registry.render(gauges, self.signals()).encode(), METRICS_TYPE)
        return not_served(found)


__all__ = ["App", "Served", "Settings", "serve_jobs"]
