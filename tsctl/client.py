"""Talk to a running TorchServe: its three APIs, with keys read from its key file and renewed before they expire.

TorchServe 0.12's traps handled here: keys live in `key_file.json` in the server's working directory, are
written non-atomically and expire after 60 minutes: they are re-read on every call and renewed through the
token API (with the API key) before expiry or when a call is refused; `/ping` says Healthy before a model is
ready: registration is synchronous, then polled until every worker is READY.
"""

from __future__ import annotations

import datetime
import http.client
import json
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ServerError(RuntimeError):
    """TorchServe did not start, stop or answer as expected; the message says what to look at."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


@dataclass(frozen=True)
class Endpoints:
    inference: str
    management: str
    metrics: str

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> Endpoints:
        return cls(props["inference_address"], props["management_address"], props["metrics_address"])

    @classmethod
    def on_ports(cls, inference: int, management: int, metrics: int, *, host: str = "127.0.0.1") -> Endpoints:
        return cls(f"http://{host}:{inference}", f"http://{host}:{management}", f"http://{host}:{metrics}")

    @classmethod
    def free(cls) -> Endpoints:
        """Three free loopback ports: inference, management, metrics."""
        inference, management, metrics = free_ports(3)
        return cls.on_ports(inference, management, metrics)


def read_properties(path: Path) -> dict[str, str]:
    props = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def free_ports(n: int) -> list[int]:
    """N distinct free loopback ports (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_in_use(url: str) -> bool:
    """Whether something holds `url`'s port (binds or listens there); a port whose last connections are in
    TIME_WAIT is free, as it is to the servers (they set SO_REUSEADDR: Netty, uvicorn)."""
    parts = urllib.parse.urlsplit(url)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((parts.hostname or "127.0.0.1", parts.port or 80))
        except OSError:
            return True
    return False


def request(
    url: str,
    method: str = "GET",
    body: bytes | str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Reply:
    """One HTTP call with the standard library; a refused connection raises ConnectionError."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Reply(resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()})
    finally:
        conn.close()


class KeyFile:
    """TorchServe's `key_file.json`: inference, management and API keys, re-read when it changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mtime = -1.0
        self._keys: dict[str, Any] = {}

    def reload(self) -> None:
        self._mtime = -1.0

    def key(self, kind: str) -> str | None:
        if self.path is None:
            return None
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return None
        if mtime != self._mtime:
            try:
                self._keys = json.loads(self.path.read_text())
            except (json.JSONDecodeError, FileNotFoundError):
                return None  # TorchServe is still writing it: read again on the next call
            self._mtime = mtime
        entry = self._keys.get(kind) or {}
        return entry.get("key")

    def seconds_left(self, kind: str) -> float:
        """Seconds until the key of `kind` expires (infinite without a key file or an expiry)."""
        if self.key(kind) is None:
            return float("inf")
        stamp = (self._keys.get(kind) or {}).get("expiration time")
        if not stamp:
            return float("inf")
        # TorchServe writes nanoseconds ("2026-11-30T02:07:02.507936428Z"): keep microseconds
        head, _, frac = stamp.rstrip("Z").partition(".")
        when = datetime.datetime.fromisoformat(f"{head}.{(frac or '0')[:6]}+00:00")
        return (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()

    def headers(self, kind: str) -> dict[str, str]:
        key = self.key(kind)
        return {"Authorization": f"Bearer {key}"} if key else {}


def _key_kind(api: str) -> str:
    """Which key an API takes: the management key for management, the inference key for the rest."""
    return "management" if api == "management" else "inference"


class Client:
    """Calls to a running TorchServe's three APIs, with tokens from its key file."""

    def __init__(self, endpoints: Endpoints, key_file: Path | None) -> None:
        self.endpoints = endpoints
        self.keys = KeyFile(key_file)

    def call(self, api: str, method: str, path: str, body: bytes | str | None = None, **kw: Any) -> Reply:
        base = getattr(self.endpoints, api)
        kind = _key_kind(api)
        headers = {**self.keys.headers(kind), **kw.pop("headers", {})}
        reply = request(base + path, method, body, headers, **kw)
        if reply.status in (400, 401) and b"Token" in reply.body and self.renew(api):
            headers.update(self.keys.headers(kind))
            reply = request(base + path, method, body, headers, **kw)
        return reply

    def renew(self, api: str) -> bool:
        """Ask for a new key with the API key (TorchServe's token API); True if the key file changed."""
        api_key = self.keys.key("API")
        if not api_key:
            return False
        kind = _key_kind(api)
        before = self.keys.key(kind)
        reply = request(
            f"{self.endpoints.management}/token?type={kind}", "POST", headers={"Authorization": f"Bearer {api_key}"}
        )
        if reply.status != 200:
            return False
        self.keys.reload()
        return self.keys.key(kind) != before

    def ensure_fresh(self, margin_s: float = 600.0) -> bool:
        """Renew the inference and management keys if either expires within `margin_s`; True if renewed."""
        expiring = [kind for kind in ("inference", "management") if self.keys.seconds_left(kind) < margin_s]
        return all(self.renew(kind) for kind in expiring) and bool(expiring)

    def ping(self) -> bool:
        try:
            return self.call("inference", "GET", "/ping", timeout=5).status == 200
        except OSError:
            return False

    def register(
        self,
        mar: str,
        name: str,
        batch_size: int,
        max_batch_delay: int,
        workers: int = 2,
        response_timeout: int = 120,
        timeout: float = 300.0,
    ) -> None:
        """Register an archive from the model store and wait until a worker is READY."""
        query = urllib.parse.urlencode(
            {
                "url": mar,
                "model_name": name,
                "batch_size": batch_size,
                "max_batch_delay": max_batch_delay,
                "initial_workers": workers,
                "response_timeout": response_timeout,
                "synchronous": "true",
            }
        )
        reply = self.call("management", "POST", f"/models?{query}", timeout=timeout)
        if reply.status != 200:
            raise ServerError(f"registering {name} from {mar} failed: HTTP {reply.status} {reply.text.strip()}")
        # The archive's minWorkers/maxWorkers win over initial_workers: scale to what was asked.
        self.scale(name, workers, timeout)

    def scale(self, name: str, workers: int, timeout: float = 300.0) -> None:
        query = urllib.parse.urlencode({"min_worker": workers, "max_worker": workers, "synchronous": "true"})
        reply = self.call("management", "PUT", f"/models/{name}?{query}", timeout=timeout)
        if reply.status not in (200, 202):
            raise ServerError(f"scaling {name} to {workers} workers failed: HTTP {reply.status} {reply.text.strip()}")
        self.wait_ready(name, workers, timeout)

    def wait_ready(self, name: str, workers: int = 1, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = self.call("management", "GET", f"/models/{name}")
            if reply.status == 200:
                states = [w.get("status") for w in reply.json()[0].get("workers", [])]
                if states.count("READY") == workers == len(states):
                    return
            time.sleep(0.25)
        raise ServerError(f"model {name}: fewer than {workers} workers READY after {timeout:.0f} s")

    def unregister(self, name: str, timeout: float = 120.0) -> None:
        reply = self.call("management", "DELETE", f"/models/{name}", timeout=timeout)
        if reply.status not in (200, 404):
            raise ServerError(f"unregistering {name} failed: HTTP {reply.status} {reply.text.strip()}")

    def models(self) -> list[str]:
        reply = self.call("management", "GET", "/models")
        return [m["modelName"] for m in reply.json().get("models", [])] if reply.status == 200 else []

    def metrics(self) -> str:
        reply = self.call("metrics", "GET", "/metrics")
        if reply.status != 200:
            raise ServerError(f"/metrics answered HTTP {reply.status}: {reply.text.strip()[:200]}")
        return reply.text

    def predict(self, name: str, body: bytes | str, content_type: str | None = "application/json") -> Reply:
        headers = {"Content-Type": content_type} if content_type else {}
        return self.call("inference", "POST", f"/predictions/{name}", body, headers=headers)
