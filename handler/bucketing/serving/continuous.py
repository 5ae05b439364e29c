"""`handler.schedule: continuous`: a pool of tokenized texts that spans TorchServe calls.

With `continuousBatching: true` TorchServe's frontend (`ContinuousBatching.java`) keeps every request the handler
did not answer in the worker's batch and sends it again, whole, on the next call, with new requests filling the
free slots at once (no `maxBatchDelay` wait while anything is pending). A request counts as answered when the
call's response carries a prediction for it; the handler leaves a pending request out of the response by taking
its index out of `context.request_ids`, which TorchServe's backend reads to write the response. So a pending
request gets nothing a client could see: no status, no body, no header.

Each call: new requests are parsed and tokenized (4xx and 5xx answered at once, as under `batch`); the pool
forgets any request TorchServe no longer sends (its client went away); `scheduler.pick` chooses about
`slice_ms` of texts (up to `max_wait_ms` when the call brought no new request: see `Pool.serve`); they run as the
configured strategy plans them; every request whose texts are all done is answered. A failed pass fails only the
requests whose texts it held, each with its own 500. The call is one `Pipeline.step` (the batch schedule's too),
given the requests in flight and the scheduler's choice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from bucketing.config import ConfigError
from bucketing.metrics import BatchStats
from bucketing.planning import scheduler
from bucketing.planning.planner import CostModel
from bucketing.protocols import Reply
from bucketing.protocols.base import Meta
from bucketing.serving.pipeline import InFlight, Pipeline, call_stats


def check_model_config(model_config: Any) -> None:
    """What `continuous` needs of the model-config (its top-level keys, as TorchServe reads them): the
    continuous-batching aggregator, and one worker (TorchServe 0.12 holds the model's queue lock while an idle
    worker waits for a request, so another worker's pending request could wait for the next arrival)."""
    top = model_config if isinstance(model_config, dict) else {}
    if top.get("continuousBatching") is not True:
        raise ConfigError(
            "handler.schedule: got 'continuous' without continuousBatching: true in the model-config; "
            "TorchServe's default batching would leave a pending request unanswered (build the archive with "
            "`python -m model_store.build --schedule continuous`, which sets both)"
        )
    workers = top.get("maxWorkers", 1)
    if isinstance(workers, int) and workers > 1:
        raise ConfigError(
            f"handler.schedule: got 'continuous' with maxWorkers {workers}; allowed: one worker per model "
            "(TorchServe 0.12 holds the model's queue lock while an idle worker waits, so another worker's "
            "pending request could wait for the next arrival); use torch_threads for the cores instead"
        )


class Pool:
    """The pending requests of one worker, by TorchServe request id, and when each last ran (or arrived)."""

    def __init__(self, pipeline: Pipeline, cost: CostModel, clock: Callable[[], float] = time.monotonic) -> None:
        self.pipeline, self.cost, self.clock = pipeline, cost, clock
        self.entries: dict[str, InFlight] = {}
        self.arrived: dict[str, float] = {}  # when it came, then when a call last ran any of its texts

    def serve(
        self, rows: Sequence[Any], meta: Sequence[Meta], keys: Sequence[str], model_name: str
    ) -> tuple[list[Reply | None], BatchStats]:
        """A reply for each row answered in this call (None for one still pending), and the call's figures."""
        start, now = time.perf_counter(), self.clock()
        pipeline, config = self.pipeline, self.pipeline.config
        planned = pipeline.task.planned  # a row's tokens as planned (fewer for one no transformer runs)
        position = {key: i for i, key in enumerate(keys)}
        for key in [k for k in self.entries if k not in position]:
            del self.entries[key], self.arrived[key]  # TorchServe dropped it (the client went away): nothing to answer
        held = [self.entries.get(key) for key in keys]
        # A call that brought no new request (a bulk request alone, say) runs up to max_wait_ms of passes rather
        # than a slice: fewer calls, each of which TorchServe pays in full (it sends every pending body again), and
        # a request arriving meanwhile waits for at most that. Pending work is never left for long: with one worker
        # (check_model_config) TorchServe calls again at once while anything is pending. (With a second worker an
        # idle one waits for the next request holding the model's queue lock, so work could wait with it.)
        slice_ms = config.slice_ms if None in held else max(config.slice_ms, config.max_wait_ms)

        def choose(flight: dict[int, InFlight]) -> list[tuple[int, int]]:
            live = list(flight)
            pool = [
                scheduler.Pending(
                    keys[i], self.arrived.get(keys[i], now), tuple(planned(x.encoded) for x in flight[i].remaining)
                )
                for i in live
            ]
            chosen = scheduler.pick(pool, now, self.cost, slice_ms, config.max_wait_ms, config.max_batch_tokens)
            taken.extend(live[pos] for pos, _ in chosen.take)
            return [(live[pos], n) for pos, n in chosen.take]

        taken: list[int] = []
        done, stats = pipeline.step(rows, meta, held, choose, model_name)
        ran_at = self.clock()
        replies: list[Reply | None] = [None] * len(rows)
        for i, (key, outcome) in enumerate(zip(keys, done)):
            if isinstance(outcome, InFlight):
                self.entries[key] = outcome
                self.arrived.setdefault(key, now)
            else:
                replies[i] = outcome
                self.entries.pop(key, None)
                self.arrived.pop(key, None)
        for i in taken:  # it ran: its wait starts again, so a bulk request cut across calls yields to new ones
            if keys[i] in self.arrived:
                self.arrived[keys[i]] = ran_at
        return replies, call_stats(stats, [r for r in replies if r is not None], start)
