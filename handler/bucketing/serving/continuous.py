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
requests whose texts it held, each with its own 500.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bucketing import protocols
from bucketing.config import ConfigError
from bucketing.metrics import BatchStats
from bucketing.planning import scheduler
from bucketing.planning.planner import CostModel
from bucketing.protocols import Incoming, Reply
from bucketing.protocols.base import Meta
from bucketing.serving.pipeline import Item, Pipeline, answers_of, call_stats


@dataclass
class Entry:
    """A pending request: its parsed form, its texts' tokens, the outputs of those run so far."""

    incoming: Incoming
    items: list[Item]
    arrived: float  # when it came, then when a call last ran any of its texts: how long it has waited
    outputs: list[Any] = field(default_factory=list)

    @property
    def remaining(self) -> list[Item]:
        return self.items[len(self.outputs) :]


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
    """The pending requests of one worker, by TorchServe request id."""

    def __init__(self, pipeline: Pipeline, cost: CostModel, clock: Callable[[], float] = time.monotonic) -> None:
        self.pipeline, self.cost, self.clock = pipeline, cost, clock
        self.entries: dict[str, Entry] = {}

    def serve(
        self, rows: Sequence[Any], meta: Sequence[Meta], keys: Sequence[str], model_name: str
    ) -> tuple[list[Reply | None], BatchStats]:
        """A reply for each row answered in this call (None for one still pending), and the call's figures."""
        start, now = time.perf_counter(), self.clock()
        pipeline, config = self.pipeline, self.pipeline.config
        planned = pipeline.task.planned  # a row's tokens as planned (fewer for one no transformer runs)
        replies: list[Reply | None] = [None] * len(rows)
        position = {key: i for i, key in enumerate(keys)}
        for key in [k for k in self.entries if k not in position]:
            del self.entries[key]  # TorchServe dropped it (the client went away): nothing to answer
        new = [i for i, key in enumerate(keys) if key not in self.entries]
        parsed = [protocols.parse(rows[i], meta[i], pipeline.limits) for i in new]
        parsed, items = pipeline.tokenize(parsed)
        by_request: dict[int, list[Item]] = {}
        for item in items:
            by_request.setdefault(item.request, []).append(replace(item, request=0))
        for j, i in enumerate(new):
            mine = by_request.get(j, [])
            if parsed[j].request is None or not mine:
                replies[i] = pipeline.reply(parsed[j], [], model_name)
            else:
                self.entries[keys[i]] = Entry(parsed[j], mine, now)

        live = [k for k in keys if k in self.entries]
        pool = [
            scheduler.Pending(k, self.entries[k].arrived, tuple(planned(x.encoded) for x in self.entries[k].remaining))
            for k in live
        ]
        # A call that brought no new request (a bulk request alone, say) runs up to max_wait_ms of passes rather
        # than a slice: fewer calls, each of which TorchServe pays in full (it sends every pending body again), and
        # a request arriving meanwhile waits for at most that. Pending work is never left for long: with one worker
        # (check_model_config) TorchServe calls again at once while anything is pending. (With a second worker an
        # idle one waits for the next request holding the model's queue lock, so work could wait with it.)
        slice_ms = config.slice_ms if new else max(config.slice_ms, config.max_wait_ms)
        chosen = scheduler.pick(pool, now, self.cost, slice_ms, config.max_wait_ms, config.max_batch_tokens)
        incoming = [self.entries[k].incoming for k in live]
        run = [replace(x, request=pos) for pos, n in chosen.take for x in self.entries[live[pos]].remaining[:n]]
        outcome, outputs, stats = pipeline.run(incoming, run)
        ran: dict[int, list[Any]] = {}
        for item, output in zip(run, outputs):
            ran.setdefault(item.request, []).append(output)
        ran_at = self.clock()
        for pos, results in ran.items():
            key, entry = live[pos], self.entries[live[pos]]
            entry.arrived = (
                ran_at  # it ran: its wait starts again, so a bulk request cut across calls yields to new ones
            )
            if outcome[pos].request is None:  # a pass holding its texts failed: its own 500, now
                replies[position[key]] = pipeline.reply(outcome[pos], [], model_name)
            else:
                entry.outputs.extend(results)
                if entry.remaining:
                    continue
                answers = answers_of(pipeline.task, entry.items, entry.outputs).get(0, [])
                replies[position[key]] = pipeline.reply(entry.incoming, answers, model_name)
            del self.entries[key]
        return replies, call_stats(stats, [r for r in replies if r is not None], start)
