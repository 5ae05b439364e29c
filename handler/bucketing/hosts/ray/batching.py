"""How a Ray Serve replica batches: `serve.batch` with a `batch_size_fn` counting requests and tokens in one unit.

`serve.batch` closes a batch at `max_batch_size` units of its `batch_size_fn`, and refuses (an error) one request
larger than that alone. We want TorchServe's two closing rules at once: at most `batch_size` requests, and at most
`max_tokens` estimated tokens (the standalone batcher's). With `max_batch_size = batch_size` and

    cost(batch) = max(len(batch), ceil(tokens(batch) * batch_size / max_tokens))

`cost <= batch_size` holds exactly when the batch has at most `batch_size` requests AND at most `max_tokens` tokens
(`ceil(t * B / M) <= B` iff `t <= M`, all integers). A request whose tokens alone are over `max_tokens` (a bulk
request) would be refused by `serve.batch`: it goes around the batcher (`bypasses`) and is served as its own batch
on the replica's one worker thread, as the standalone batcher serves it alone. Pure: no Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bucketing.metrics import CAPACITY, Labels, QueueSignals, Sample

BYTES_PER_TOKEN = 4  # the token estimate: body bytes / 4, as the standalone batcher's (never a tokenizer call)


@dataclass(frozen=True)
class Item:
    """One request on its way to a model replica: what `rows.torchserve_row` reads, and its estimated tokens."""

    body: bytes
    headers: dict[str, str]
    url_path: str | None
    tokens: int
    key: str = ""  # the request's id (the continuous pool's key for it)


def estimate_tokens(body: bytes) -> int:
    return len(body) // BYTES_PER_TOKEN


@dataclass(frozen=True)
class Budget:
    """A replica's batch limits: `batch_size` requests and `max_tokens` estimated tokens at most."""

    batch_size: int
    max_tokens: int

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_tokens < 1:
            raise ValueError(f"batch budget: batch_size and max_tokens must be >= 1, got {self}")

    def cost(self, items: Sequence[Any]) -> int:
        """`serve.batch`'s batch_size_fn: a batch's size in request units (see the module's docstring)."""
        tokens = sum(int(getattr(item, "tokens", 0)) for item in items)
        by_tokens = -(-tokens * self.batch_size // self.max_tokens)  # ceil, in integers
        return max(len(items), by_tokens)

    def bypasses(self, item: Item) -> bool:
        """Whether a request is over the token budget alone: `serve.batch` would refuse it, so it goes around."""
        return item.tokens > self.max_tokens


class Signals(Protocol):
    """What a `Waiting` tells as requests move (`bucketing.metrics.QueueSignals`'s calls)."""

    def admitted(self, tokens: int) -> None: ...
    def left(self, tokens: int) -> None: ...
    def started(self, tokens: int, waited_s: float) -> None: ...
    def finished(self, count: int = 1) -> None: ...


@dataclass
class Waiting:
    """What waits in a replica's batcher (admitted, not yet in a running batch), by request key: `requests` and
    `tokens` are the queue gauges (and autoscaling signals) to export; `running` counts requests being served.

    Each move is told to `signals` (the replica's `QueueSignals`): `add` admits, `start` starts (with the seconds
    since `add`), `finish` finishes, `drop` of one still queued leaves."""

    queued: dict[str, int] = field(default_factory=dict)  # key -> estimated tokens
    running: int = 0
    signals: Signals | None = None
    clock: Callable[[], float] = time.monotonic
    arrived: dict[str, float] = field(default_factory=dict)  # key -> clock() at add

    @property
    def requests(self) -> int:
        return len(self.queued)

    @property
    def tokens(self) -> int:
        return sum(self.queued.values())

    def add(self, item: Item) -> None:
        self.queued[item.key] = item.tokens
        self.arrived[item.key] = self.clock()
        if self.signals is not None:
            self.signals.admitted(item.tokens)

    def take(self, items: Sequence[Item]) -> None:
        """A batch starts: its requests leave the queue (started, with the seconds each waited)."""
        now = self.clock()
        for item in items:
            tokens = self.queued.pop(item.key, None)
            arrived = self.arrived.pop(item.key, now)
            if tokens is not None and self.signals is not None:
                self.signals.started(tokens, max(0.0, now - arrived))

    def start(self, items: Sequence[Item]) -> None:
        """A batch runs: its requests leave the queue (`take`) and count as running."""
        self.take(items)
        self.running += len(items)

    def finish(self, items: Sequence[Item]) -> None:
        """A batch is answered (or failed): its requests stop running."""
        self.running -= len(items)
        if self.signals is not None and items:
            self.signals.finished(len(items))

    def drop(self, item: Item) -> None:
        """A request leaves without running (its caller gave up), or after it ran (a no-op then)."""
        tokens = self.queued.pop(item.key, None)
        self.arrived.pop(item.key, None)
        if tokens is not None and self.signals is not None:
            self.signals.left(tokens)

    def snapshot(self) -> dict[str, int]:
        return {"requests": self.requests, "tokens": self.tokens, "running": self.running}


def summed(replicas: Iterable[Iterable[Sample]], labels: Labels = ()) -> list[Sample]:
    """Replicas' queue signals (`QueueSignals.samples()`, unlabelled) as one model's, `labels` put first: each
    series' values summed (gauges and histogram counts alike), but the capacity gauge, one replica's (`max`): the
    autoscaling ratios divide by one pod's capacity (docs/operations/autoscaling.md)."""
    out: dict[tuple[str, Labels], Sample] = {}
    for samples in replicas:
        for name, kind, own, value in samples:
            key = (name, own)
            if key in out:
                before = out[key][3]
                value = max(before, value) if name == CAPACITY else before + value
            out[key] = (name, kind, (*labels, *own), value)
    return list(out.values())


def model_signals(names: Sequence[str], latest: Mapping[str, list[list[Sample]]]) -> list[Sample]:
    """Every model's queue signals summed over its replicas, labelled by model; zeros for one none reported."""
    out: list[Sample] = []
    for name in names:
        labels = (("ModelName", name),)
        replicas = latest.get(name)
        out += summed(replicas, labels) if replicas else QueueSignals().samples(labels)
    return out


__all__ = ["BYTES_PER_TOKEN", "Budget", "Item", "Signals", "Waiting", "estimate_tokens", "model_signals", "summed"]
