"""The Ray host's HTTP answers, over the shared route table (`hosts.routes`) and TorchServe's rows (`hosts.rows`,
built on the model's replica): every request the worker answers reaches it as behind TorchServe, and what the host
answers itself (authorization, limits, health, TorchServe's 404/405 bodies) is the standalone host's, with its
helpers (`hosts.answers`: `ts_error`, `read_body`, `Answer`, ...), so the bytes are the same.

A drain (`drain`, reached through the ingress's deployment handle by `python -m bucketing.hosts.ray.drain`, what
`make stop` runs before the head's SIGTERM): predictions get the standalone host's 503 with `Retry-After` and
readiness says no, those admitted are answered, then newcomers are told 503 until none came for `QUIET_S`.

No Ray here: the caller gives `predict(name, item)` (the model's deployment handle, its failures already turned
into answers) and `ready(name)`; `tests/unit/test_hosts_ray.py` runs it with fakes.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from bucketing.hosts import routes
from bucketing.hosts.answers import (
    EXEMPT,
    TOKEN_MESSAGE,
    Answer,
    Drain,
    Receive,
    body_model,
    not_served,
    read_body,
    ts_error,
    unavailable,
)
from bucketing.hosts.ray.batching import Item, estimate_tokens
from bucketing.hosts.standalone.prometheus import CONTENT_TYPE as METRICS_TYPE

logger = logging.getLogger("bucketing.hosts.ray")

Predict = Callable[[str, Item], Awaitable[Answer]]
Ready = Callable[[str], Awaitable[bool]]
Metrics = Callable[[], Awaitable[str]]  # the `/metrics` text (Prometheus' exposition format)
SERVER_NAME = "bucketing-ray"
POLL_S = 0.05  # how often a drain looks whether what was admitted is answered
METRICS_MESSAGE = (
    "Not served by this Ray ingress: no queue signals were given to it (Ray exports its serve_* series on each "
    "node's metrics port, ray start --metrics-export-port)"
)


@dataclass(frozen=True)
class Limits:
    """The ingress's own limits and key (a model's batching is its deployment's)."""

    key: str | None = None  # None: no authorization
    max_request_bytes: int = 8 * 1024 * 1024  # TorchServe's max_request_size in config/config.properties
    request_timeout_s: float = 120.0  # TorchServe's default responseTimeout: 504 past it


class Front:
    """The HTTP side of the Ray host: one per ingress replica."""

    def __init__(
        self,
        versions: Mapping[str, str],
        predict: Predict,
        ready: Ready,
        limits: Limits,
        metrics: Metrics | None = None,
    ) -> None:
        self.versions = dict(versions)
        self.metrics = metrics
        self.predict = predict
        self.ready = ready
        self.limits = limits
        self.stopping = Drain()
        self.in_flight = 0  # predictions admitted and not yet answered

    def authorized(self, headers: Mapping[str, str]) -> bool:
        key = self.limits.key
        if key is None:
            return True
        scheme, _, sent = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(), key.encode())

    async def answer(self, method: str, path: str, headers: Mapping[str, str], receive: Receive) -> Answer:
        """The answer to one request (`headers` with lower-case names; `receive`: the ASGI body's)."""
        found = routes.match(method, path, self.versions)
        counted = found.action == "predict"
        self.in_flight += counted
        try:
            return await self._answer(found, headers, receive)
        except Exception:  # a fault of the host itself: logged, answered as TorchServe answers a failed prediction
            logger.exception("%s %s failed", method, path)
            return Answer(503, ts_error(503, "InternalServerException", "Prediction failed"))
        finally:
            self.in_flight -= counted

    async def drain(self, timeout_s: float) -> bool:
        """Admit no more predictions, wait up to `timeout_s` until those admitted are answered, then within the same
        time tell newcomers 503 until none came for `QUIET_S`; whether every admitted one was answered."""
        loop = asyncio.get_running_loop()
        self.stopping.draining = True
        deadline = loop.time() + timeout_s
        while self.in_flight and loop.time() < deadline:
            await asyncio.sleep(POLL_S)
        answered = self.in_flight == 0
        await self.stopping.quiet(deadline)
        return answered

    async def _answer(self, found: routes.Match, headers: Mapping[str, str], receive: Receive) -> Answer:
        if found.action not in EXEMPT and not self.authorized(headers):
            refused = ts_error(401, "InvalidKeyException", TOKEN_MESSAGE)
            return Answer(401, refused, headers=(("WWW-Authenticate", "Bearer"),))
        if found.action != "predict":
            return await self._host_answer(found)
        if self.stopping.draining:
            return self.stopping.turn_away()
        name = found.model or ""
        body = await read_body(receive, dict(headers), self.limits.max_request_bytes)
        if body is None:
            limit = self.limits.max_request_bytes
            message = f"the request body is over {limit} bytes (max_request_bytes); send fewer texts per request"
            return Answer(413, ts_error(413, "RequestEntityTooLarge", message))
        if found.by_body:  # a root OpenAI route with several models: the body's `model` names one
            chosen = body_model(body) or ""
            name = chosen if chosen in self.versions else name
        item = Item(body, dict(headers), found.url_path, estimate_tokens(body))
        timeout = self.limits.request_timeout_s
        try:
            return await asyncio.wait_for(self.predict(name, item), timeout)
        except TimeoutError:
            return unavailable(
                f'Model "{name}": the request was not answered within {timeout:g} s (request_timeout_s); send fewer '
                "or shorter texts per request, or add replicas",
                504,
                "RequestTimeout",
            )

    async def _host_answer(self, found: routes.Match) -> Answer:
        action, name = found.action, found.model or ""
        if action == "ping":  # TorchServe's, byte for byte
            return Answer(200, json.dumps({"status": "Healthy"}, indent=2).encode() + b"\n")
        if action == "live":
            return Answer(200, b'{"live":true}')
        if action == "ready":
            ready = not self.stopping.draining and all(await asyncio.gather(*(self.ready(n) for n in self.versions)))
            return Answer(200 if ready else 503, json.dumps({"ready": ready}, separators=(",", ":")).encode())
        if action == "server_meta":
            meta = {"name": SERVER_NAME, "version": "0.2.0", "extensions": []}
            return Answer(200, json.dumps(meta, separators=(",", ":")).encode())
        if action in ("model_ready", "model_v1"):
            ready = not self.stopping.draining and await self.ready(name)
            return Answer(200 if ready else 503, json.dumps({"name": name, "ready": ready}).encode())
        if action == "model_v2":
            meta = {
                "name": name,
                "versions": [self.versions[name]],
                "platform": "bucketing",
                "inputs": [],
                "outputs": [],
            }
            return Answer(200, json.dumps(meta).encode())
        if action == "metrics" and self.metrics is not None:
            return Answer(200, (await self.metrics()).encode(), METRICS_TYPE)
        if action == "metrics":
            return Answer(404, ts_error(404, "ResourceNotFoundException", METRICS_MESSAGE))
        return not_served(found)


__all__ = ["METRICS_MESSAGE", "POLL_S", "SERVER_NAME", "Front", "Limits", "Metrics", "Predict", "Ready"]
