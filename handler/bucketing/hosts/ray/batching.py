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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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


@dataclass
class Waiting:
    """What waits in a replica's batcher (admitted, not yet in a running batch), by request key: `requests` and
    `tokens` are the queue gauges (and autoscaling signals) to export; `running` counts requests being served."""

    queued: dict[str, int] = field(default_factory=dict)  # key -> estimated tokens
    running: int = 0

    @property
    def requests(self) -> int:
        return len(self.queued)

    @property
    def tokens(self) -> int:
        return sum(self.queued.values())

    def add(self, item: Item) -> None:
        self.queued[item.key] = item.tokens

    def take(self, items: Sequence[Item]) -> None:
        """A batch starts: its requests leave the queue."""
        for item in items:
            self.queued.pop(item.key, None)

    def drop(self, item: Item) -> None:
        """A request leaves without running (its caller gave up), or after it ran (a no-op then)."""
        self.queued.pop(item.key, None)

    def snapshot(self) -> dict[str, int]:
        return {"requests": self.requests, "tokens": self.tokens, "running": self.running}


__all__ = ["BYTES_PER_TOKEN", "Budget", "Item", "Waiting", "estimate_tokens"]
