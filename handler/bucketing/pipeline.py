"""The steps of one delivered batch, as plain functions over plain data (the handler only wires them)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any

from .config import HandlerConfig
from .metrics import BatchStats
from .planner import CostModel, Plan, plan_bucketed, plan_dynamic, plan_static
from .requests import Parsed, RequestError, parse_request
from .tasks import Encoded, Task, Tokenizer, collate

Planner = Callable[[Sequence[int]], Plan]


@dataclass(frozen=True)
class Item:
    """One text to run: the request it belongs to, and its tokens."""

    request: int
    encoded: Encoded


@dataclass(frozen=True)
class Prepared:
    """A delivered batch after parsing and tokenization: per-request outcome, and the texts to run."""

    parsed: tuple[Parsed, ...]
    items: tuple[Item, ...]


@dataclass(frozen=True)
class Computed:
    """One output per item, in item order, and what the batch cost."""

    outputs: tuple[Any, ...]
    stats: BatchStats


def make_planner(config: HandlerConfig, cost: CostModel) -> Planner:
    """The planner for the configured strategy, with its constants bound."""
    if config.strategy == "static":
        return partial(plan_static, max_length=config.max_length)
    if config.strategy == "dynamic":
        return partial(plan_dynamic, pad_to_multiple_of=config.pad_to_multiple_of)
    return partial(
        plan_bucketed,
        cost=cost,
        max_batch_tokens=config.max_batch_tokens,
        pad_to_multiple_of=config.pad_to_multiple_of,
    )


def content_type(context: Any, idx: int) -> str | None:
    """The request body's Content-Type as TorchServe recorded it (per parameter, then per request)."""
    try:
        headers = context.get_all_request_header(idx) or {}
    except (AttributeError, IndexError, TypeError):
        return None
    for name in ("body", "data"):
        value = headers.get(name)
        if isinstance(value, dict) and value.get("content-type"):
            return value["content-type"]
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == "content-type" and isinstance(value, str):
            return value
    return None


def prepare(
    rows: Sequence[Any],
    content_types: Sequence[str | None],
    config: HandlerConfig,
    tokenizer: Tokenizer,
) -> Prepared:
    """Parse every request, tokenize all good texts at once, and reject overflow where configured."""
    parsed = [parse_request(row, ct, config.max_texts_per_request) for row, ct in zip(rows, content_types)]
    owners = [i for i, p in enumerate(parsed) if not isinstance(p, RequestError) for _ in p.texts]
    texts = [t for p in parsed if not isinstance(p, RequestError) for t in p.texts]
    encoded = tokenizer.encode(texts)
    items = [Item(owner, enc) for owner, enc in zip(owners, encoded)]
    if config.on_overflow == "reject":
        items = _reject_overflow(parsed, items, config.max_length)
    return Prepared(tuple(parsed), tuple(items))


def _reject_overflow(parsed: list[Parsed], items: list[Item], max_length: int) -> list[Item]:
    """Mark requests with a text over max_length as 413 (in place) and drop their items."""
    position: dict[int, int] = {}
    for item in items:
        index = position.get(item.request, 0)
        position[item.request] = index + 1
        request = parsed[item.request]
        if item.encoded.truncated and not isinstance(request, RequestError):
            parsed[item.request] = RequestError(
                413,
                "TextTooLong",
                f"{request.where(index)} has more than max_length={max_length} tokens (on_overflow: reject)",
            )
    return [item for item in items if not isinstance(parsed[item.request], RequestError)]


def compute(prepared: Prepared, plan_fn: Planner, task: Task, pad_id: int) -> Computed:
    """Plan the sub-batches, run each forward pass, and restore item order."""
    rows = [item.encoded.ids for item in prepared.items]
    plan = plan_fn([len(r) for r in rows])
    start = time.perf_counter()
    results = []
    for sb in plan.sub_batches:
        ids, mask = collate([rows[i] for i in sb.indices], sb.padded_len, pad_id)
        results.append(task.forward(ids, mask))
    forward_ms = (time.perf_counter() - start) * 1000.0
    outputs = plan.restore(results)
    stats = BatchStats(
        requests=len(prepared.parsed),
        rejected=sum(isinstance(p, RequestError) for p in prepared.parsed),
        texts=len(rows),
        real_tokens=plan.real_tokens,
        padded_tokens=plan.padded_tokens,
        sub_batches=len(plan.sub_batches),
        forward_ms=round(forward_ms, 3),
    )
    return Computed(tuple(outputs), stats)


@dataclass(frozen=True)
class Response:
    """One request's answer: HTTP status and JSON body."""

    status: int
    body: str

    @property
    def phrase(self) -> str:
        return HTTPStatus(self.status).phrase


def respond(prepared: Prepared, computed: Computed, task: Task, model_name: str = "") -> list[Response]:
    """Shape every request's answer, in request order."""
    answers: dict[int, list[Any]] = {}
    for item, output in zip(prepared.items, computed.outputs):
        answers.setdefault(item.request, []).append(task.answer(output, item.encoded))
    return [
        Response(p.status, json.dumps(p.body()))
        if isinstance(p, RequestError)
        else Response(200, json.dumps(p.render(answers.get(i, []), model_name)))
        for i, p in enumerate(prepared.parsed)
    ]


def failure(message: str) -> Response:
    """The answer for a request whose processing failed on the server side."""
    body = RequestError(500, "InternalServerError", message).body()
    return Response(500, json.dumps(body))
