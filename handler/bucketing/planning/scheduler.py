"""Which pending texts a `continuous` call runs: a pure policy over plain data.

The handler keeps a pool of tokenized texts across TorchServe calls (`handler.schedule: continuous`). Each call
runs about `slice_ms` of estimated work (at least one text) and answers the requests whose texts are all done.
The order: requests that have waited `max_wait_ms` or more go first, longest waiting first (so no request
starves under a stream of shorter ones); the rest shortest remaining work first, longest waiting first among
equals (short queries do not wait for long passages). A request's wait counts from its arrival, then from the last
call that ran any of its texts (the pool's `arrived`), so a bulk request cut across calls yields to new requests.
A chosen request's texts are taken in order; the last one chosen may be taken in part.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bucketing.planning.planner import CostModel


@dataclass(frozen=True)
class Pending:
    """One request in the pool: since when it has waited (its arrival, or the last call that ran any of its texts;
    seconds, any clock) and the token lengths of its texts not yet run."""

    key: str
    arrived: float
    lengths: tuple[int, ...]


@dataclass(frozen=True)
class Pick:
    """What one call runs: for each chosen request (by position in the pool), how many of its remaining texts."""

    take: tuple[tuple[int, int], ...]
    estimated_us: float


def work_us(lengths: Sequence[int], cost: CostModel, max_batch_tokens: int) -> float:
    """Estimated microseconds to run texts of these lengths: their rows, and a pass's overhead per budget of tokens."""
    if not lengths:
        return 0.0
    passes = max(1, math.ceil(sum(lengths) / max_batch_tokens))
    return passes * cost.overhead_us + sum(cost.row_us(n) for n in lengths)


def order(pool: Sequence[Pending], now: float, cost: CostModel, max_batch_tokens: int, max_wait_s: float) -> list[int]:
    """Pool positions in the order they are served (see the module docstring)."""

    def key(i: int) -> tuple[int, float, float]:
        p = pool[i]
        if now - p.arrived >= max_wait_s:
            return (0, p.arrived, 0.0)
        return (1, work_us(p.lengths, cost, max_batch_tokens), p.arrived)

    return sorted(range(len(pool)), key=key)


def pick(
    pool: Sequence[Pending], now: float, cost: CostModel, slice_ms: float, max_wait_ms: float, max_batch_tokens: int
) -> Pick:
    """The texts to run now: requests in `order`, whole while the slice holds, at least one text in all."""
    budget_us = slice_ms * 1000.0
    take: list[tuple[int, int]] = []
    tokens, rows_us, texts = 0, 0.0, 0  # of what is chosen so far: work_us, kept as running sums

    def with_text(n: int) -> float:
        passes = max(1, math.ceil((tokens + n) / max_batch_tokens))
        return passes * cost.overhead_us + rows_us + cost.row_us(n)

    for i in order(pool, now, cost, max_batch_tokens, max_wait_ms / 1000.0):
        lengths = pool[i].lengths
        n = 0
        while n < len(lengths) and (not texts or with_text(lengths[n]) <= budget_us):
            tokens, rows_us, texts = tokens + lengths[n], rows_us + cost.row_us(lengths[n]), texts + 1
            n += 1
        if n:
            take.append((i, n))
        if n < len(lengths):
            break  # the slice is full: what comes later waits for the next call
    passes = max(1, math.ceil(tokens / max_batch_tokens)) if texts else 0
    return Pick(tuple(take), passes * cost.overhead_us + rows_us)
