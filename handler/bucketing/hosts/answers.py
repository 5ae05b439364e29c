"""What a host that owns its HTTP answers itself and reads, shared by the standalone and Ray hosts so their bytes
are the same: TorchServe's error bodies and messages, a whole HTTP answer, the 503 with `Retry-After`, what a route
no model answers gets, a body read up to a limit, the model an OpenAI body names, and the ASGI types and send."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from bucketing.hosts import routes
from bucketing.protocols.base import Reply

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

RETRY_AFTER_S = 1  # what a 503 of a full queue or a draining server tells the client to wait
QUIET_S = 1.0  # after a drain, newcomers are told 503 until none came for this long (then the port may close)
SHUTTING_DOWN = "the server is shutting down: send the request to another replica"
JSON = "application/json"
# TorchServe's own answers, as its frontend writes them (Gson, indented by two spaces).
TOKEN_MESSAGE = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
NOT_FOUND_MESSAGE = "Requested resource is not found, please refer to API document."
NOT_ALLOWED_MESSAGE = "Requested method is not allowed, please refer to API document."
EXEMPT = ("ping", "live", "ready")  # probes: a kubelet sends no token


def ts_error(status: int, kind: str, message: str) -> bytes:
    """An error body in TorchServe's frontend shape (indented, ending in a newline)."""
    return json.dumps({"code": status, "type": kind, "message": message}, indent=2).encode() + b"\n"


@dataclass(frozen=True)
class Answer:
    """A whole HTTP answer."""

    status: int
    body: bytes
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()


def reply_answer(reply: Reply) -> Answer:
    body = reply.body.encode() if isinstance(reply.body, str) else bytes(reply.body)
    return Answer(reply.status, body, reply.content_type, tuple(reply.headers))


def unavailable(message: str, status: int = 503, kind: str = "ServiceUnavailableException") -> Answer:
    return Answer(status, ts_error(status, kind, message), headers=(("Retry-After", str(RETRY_AFTER_S)),))


class Drain:
    """A host's drain (SIGTERM, or before its cluster stops), shared by the standalone and Ray hosts: once
    `draining`, each prediction is turned away with a 503 and `Retry-After` (`turn_away`); once the admitted ones
    are answered, `quiet` waits until no newcomer was turned away for `QUIET_S`, so that a client answered at the
    drain's end that sends again at once is told to retry elsewhere, not reset by a closing port (the kernel resets
    a connection that reaches a port as it closes)."""

    def __init__(self) -> None:
        self.draining = False
        self._turned_away_at = 0.0  # loop time of the last prediction told 503 for the drain

    def turn_away(self) -> Answer:
        self._turned_away_at = asyncio.get_running_loop().time()
        return unavailable(SHUTTING_DOWN)

    async def quiet(self, deadline: float) -> None:
        """Until `deadline` (loop time), wait until no newcomer was turned away for `QUIET_S` from now."""
        loop = asyncio.get_running_loop()
        self._turned_away_at = max(self._turned_away_at, loop.time())
        while (now := loop.time()) < deadline and now - self._turned_away_at < QUIET_S:
            await asyncio.sleep(min(deadline, self._turned_away_at + QUIET_S) - now)


def not_served(found: routes.Match) -> Answer:
    """What a route no model answers gets (TorchServe's and KServe's bodies): a model or version not found, a method
    not allowed, else a resource not found."""
    name = found.model or ""
    if found.action == "model_not_found":
        return Answer(404, ts_error(404, "ModelNotFoundException", f"Model not found: {name}"))
    if found.action == "version_not_found":
        message = f"Model version: {found.version} does not exist for model: {name}"
        return Answer(404, ts_error(404, "ModelVersionNotFoundException", message))
    if found.action == "kserve_model_not_found":
        return Answer(404, json.dumps({"error": f"Model with name {name} does not exist."}).encode())
    if found.action == "method_not_allowed":
        return Answer(405, ts_error(405, "MethodNotAllowedException", NOT_ALLOWED_MESSAGE))
    return Answer(404, ts_error(404, "ResourceNotFoundException", NOT_FOUND_MESSAGE))


def body_model(body: bytes) -> str | None:
    """The `model` an OpenAI body names (None when it names none or is not JSON)."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    model = value.get("model") if isinstance(value, dict) else None
    return model if isinstance(model, str) else None


async def read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes | None:
    """The request body, or None once it is over `limit` bytes (by its Content-Length, or as it streams in)."""
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def send_answer(send: Send, answer: Answer, head: bool = False) -> None:
    headers = [(b"content-type", answer.content_type.encode("latin-1"))]
    headers.append((b"content-length", str(len(answer.body)).encode()))
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else answer.body})


__all__ = [
    "EXEMPT",
    "JSON",
    "NOT_ALLOWED_MESSAGE",
    "NOT_FOUND_MESSAGE",
    "QUIET_S",
    "RETRY_AFTER_S",
    "SHUTTING_DOWN",
    "TOKEN_MESSAGE",
    "Answer",
    "Drain",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "body_model",
    "not_served",
    "read_body",
    "reply_answer",
    "send_answer",
    "ts_error",
    "unavailable",
]
