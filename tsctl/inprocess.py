"""The handler in this process, as a TorchServe worker runs it: a stand-in for TorchServe's `Context`."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

TORCHSERVE_PARSES = "application/json"  # the one Content-Type TorchServe's worker parses as JSON itself


def torchserve_body(raw: bytes, content_type: str | None) -> tuple[Any, str]:
    """An HTTP body and its Content-Type header as TorchServe 0.12 hands them to a handler: the body's value and the
    row's content type. The frontend keeps the media type (Netty's `HttpUtil.getMimeType`: what precedes any `;`;
    none is ""); the worker (`ts/protocol/otf_message_handler.py`, `_retrieve_input_data`) `json.loads` a body
    whose type is exactly `application/json`, decodes a `text*` one to a string, and hands any other, or one that
    fails, over as bytes."""
    media = (content_type or "").split(";", 1)[0]
    try:
        if media == TORCHSERVE_PARSES:
            return json.loads(raw.decode("utf-8")), media
        if media.startswith("text"):
            return raw.decode("utf-8"), media
    except (ValueError, RecursionError):  # TorchServe catches any failure, logs it and forwards the bytes
        pass
    return raw, media


class LocalMetrics:
    """Records what the handler adds to TorchServe's metric cache."""

    def __init__(self) -> None:
        self.added: list[tuple[str, float, str, list[Any]]] = []

    def add_metric(
        self, name: str, value: float, unit: str, idx: Any = None, dimensions: Any = None, metric_type: Any = None
    ) -> None:
        self.added.append((name, value, unit, list(dimensions or [])))

    def totals(self) -> dict[str, float]:
        """Sums by metric name (all dimensions together)."""
        out: dict[str, float] = {}
        for name, value, _, _ in self.added:
            out[name] = out.get(name, 0) + value
        return out


class LocalContext:
    """What a handler reads from TorchServe's Context (model dir, model-config, request headers) and what it sets
    (per-request status and content type), for running a handler in process."""

    def __init__(
        self,
        handler_section: dict[str, Any],
        model_dir: str = ".",
        model_name: str = "local",
        model_config: dict[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self.system_properties = {"model_dir": model_dir, "gpu_id": None, "batch_size": 8}
        self.model_yaml_config = {**(model_config or {}), "handler": handler_section}
        self.request_ids: dict[int, str] = {}
        self.metrics = LocalMetrics()
        self.headers: list[dict[str, Any]] = []
        self.status: dict[int, tuple[int, str]] = {}
        self.content_types: dict[int, str] = {}
        self.response_headers: dict[int, dict[str, str]] = {}

    def with_requests(
        self,
        content_types: list[str | None],
        url_paths: list[str] | None = None,
        headers: list[dict[str, str]] | None = None,
        ids: list[str] | None = None,
    ) -> LocalContext:
        """Record per-request Content-Types, url_paths, headers and ids the way TorchServe's backend holds them."""
        self.request_ids = dict(enumerate(ids or [f"request-{i}" for i in range(len(content_types))]))
        paths = url_paths or [""] * len(content_types)
        extra = headers or [{}] * len(content_types)
        self.headers = [
            {**({"body": {"content-type": ct}} if ct else {}), "url_path": path, **more}
            for ct, path, more in zip(content_types, paths, extra, strict=True)
        ]
        self.status.clear()
        self.content_types.clear()
        self.response_headers.clear()
        return self

    def get_all_request_header(self, idx: int) -> dict[str, Any]:
        return self.headers[idx] if idx < len(self.headers) else {}

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self.status[idx] = (code, phrase)

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.content_types[idx] = value

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self.response_headers.setdefault(idx, {})[key] = value


class Job(NamedTuple):
    """One request waiting at the frontend: its id, its row (`{"body": ...}`), its Content-Type, its url path (what
    follows /predictions/NAME/VERSION/; "" the plain path) and any other request headers."""

    key: str
    row: Any
    content_type: str | None
    url_path: str
    headers: dict[str, str]


class ContinuousFrontend:
    """TorchServe's `ContinuousBatching` aggregator in process: a queue, a batch of at most `batch_size` jobs;
    each call sends every job of the batch (new ones fill the free slots), and a job leaves the batch when the
    handler's response carries a prediction for it (its index still in `context.request_ids` after the call)."""

    def __init__(self, handler: Any, context: LocalContext, batch_size: int, max_calls: int = 1000) -> None:
        self.handler, self.context, self.batch_size, self.max_calls = handler, context, batch_size, max_calls
        self.queue: list[Job] = []
        self.calls: list[list[str]] = []  # the ids sent in each call
        self.answers: dict[str, tuple[int, bytes | str, dict[str, str]]] = {}  # id -> (status, body, headers)
        self._batch: list[Job] = []  # jobs sent and not yet answered

    def submit(
        self,
        key: str,
        row: Any,
        content_type: str | None = "application/json",
        url_path: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Queue a request: each call that sends it tells the handler its Content-Type, url path and headers."""
        self.queue.append(Job(key, row, content_type, url_path, dict(headers or {})))

    def step(self) -> list[str]:
        """One call: the batch topped up from the queue; the ids answered in it."""
        batch = list(self._batch)
        while len(batch) < self.batch_size and self.queue:
            batch.append(self.queue.pop(0))
        keys = [job.key for job in batch]
        self.context.with_requests(
            [job.content_type for job in batch],
            [job.url_path for job in batch],
            [job.headers for job in batch],
            ids=keys,
        )
        bodies = self.handler.handle([job.row for job in batch], self.context)
        if len(bodies) != len(batch):
            raise AssertionError(f"{len(batch)} requests but {len(bodies)} bodies")
        answered = [self.context.request_ids[i] for i in sorted(self.context.request_ids)]
        for i, key in enumerate(keys):
            if i in self.context.request_ids:
                status = self.context.status.get(i, (200, ""))[0]
                self.answers[key] = (status, bodies[i], self.context.response_headers.get(i, {}))
        self._batch = [job for i, job in enumerate(batch) if i not in self.context.request_ids]
        self.calls.append(keys)
        return answered

    def drain(self) -> dict[str, tuple[int, bytes | str, dict[str, str]]]:
        """Call until every submitted job is answered (an AssertionError after `max_calls`: nothing may hang)."""
        while self.queue or self._batch:
            if len(self.calls) >= self.max_calls:
                raise AssertionError(
                    f"still {len(self.queue) + len(self._batch)} jobs unanswered after {self.max_calls} calls"
                )
            self.step()
        return self.answers
