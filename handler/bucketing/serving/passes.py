"""Rows and forward passes: a request's inputs as the rows to run (`Item`: one per input, or one per window of a
chunked text), the planner the configured strategy gives, the passes it plans run in item order (`compute`, which
starts no pass after a deadline), and each request's answers from its rows' outputs (`answers_of`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from bucketing import heap
from bucketing.answers import Answer
from bucketing.config import HandlerConfig
from bucketing.kinds.task import Rows, Task
from bucketing.metrics import BatchStats
from bucketing.model.encoded import Encoded, collate
from bucketing.planning.planner import CostModel, Plan, plan_bucketed, plan_dynamic, plan_static

Planner = Callable[[Sequence[int]], Plan]


@dataclass(frozen=True)
class Item:
    """One row to run: the request it belongs to, and its tokens (an input's, or one window of a chunked text's:
    the windows of one text are consecutive items, each holding the whole text's `Encoded`)."""

    request: int
    encoded: Encoded
    whole: Encoded | None = None  # a window's text (`on_overflow: chunk`); None: the row is the input itself
    weight: int = 0  # a window's own tokens of its text


def items_of(request: int, encoded: Sequence[Encoded]) -> list[Item]:
    """The rows of one request's inputs: one per input, or one per window of a chunked text."""
    out: list[Item] = []
    for e in encoded:
        if e.chunks:
            out.extend(Item(request, w, e, n) for w, n in zip(e.chunks, e.weights))
        else:
            out.append(Item(request, e))
    return out


def answers_of(task: Task, items: Sequence[Item], outputs: Sequence[np.ndarray | None]) -> dict[int, list[Answer]]:
    """Each request's answers, one per input in order: a chunked text's from its windows' outputs combined
    (`Task.combine`); none for a request whose outputs are None (it failed)."""
    out: dict[int, list[Answer]] = {}
    windows: list[np.ndarray] = []
    for item, output in zip(items, outputs):
        if output is None:
            continue
        whole = item.whole
        if whole is None:
            answer = task.answer(output, item.encoded)
        else:
            windows.append(output)
            if len(windows) < len(whole.chunks):
                continue
            answer = task.answer(task.combine(windows, whole.weights, whole.input_type), whole)
            windows = []
        chunking = item.encoded.chunking or whole is not None
        out.setdefault(item.request, []).append(
            replace(answer, chunks=len(whole.chunks) if whole else 1) if chunking else answer
        )
    return out


@dataclass(frozen=True)
class Deadline:
    """When a call starts no further pass (a `time.perf_counter()` value), and the cost model that says when a pass
    would end: a pass is started only if its estimated end is not past `at`."""

    at: float
    cost: CostModel

    def admits(self, rows: int, padded_len: int) -> bool:
        """Whether a pass of `rows` rows padded to `padded_len`, started now, is estimated to end by `at`."""
        return time.perf_counter() + self.cost.forward_us(rows, padded_len) / 1e6 <= self.at


@dataclass(frozen=True)
class Computed:
    """One output per item, in item order (None: its pass did not start before the deadline), and what running
    them cost."""

    outputs: tuple[np.ndarray | None, ...]
    stats: BatchStats


def make_planner(config: HandlerConfig, cost: CostModel) -> Planner:
    """The planner for the configured strategy, with its constants bound."""
    if config.planning.pads_to_max_length:
        return partial(plan_static, max_length=config.max_length)
    if not config.planning.budgeted:
        return partial(plan_dynamic, pad_to_multiple_of=config.pad_to_multiple_of)
    return partial(
        plan_bucketed,
        cost=cost,
        max_batch_tokens=config.max_batch_tokens,
        pad_to_multiple_of=config.pad_to_multiple_of,
    )


def compute(
    items: Sequence[Item], plan_fn: Planner, task: Task, pad_id: int, deadline: Deadline | None = None
) -> Computed:
    """Plan the sub-batches, run each forward pass, and restore item order; no pass starts whose estimated end is
    past `deadline` (nor any after it): its items' outputs are then None."""
    plan = plan_fn([task.planned(item.encoded) for item in items])
    start = time.perf_counter()
    results: list[list[np.ndarray]] = []
    ran = []
    for sb in plan.sub_batches:
        if deadline is not None and not deadline.admits(sb.rows, sb.padded_len):
            break
        ran.append(sb)
        encoded = [items[i].encoded for i in sb.indices]
        width = max(sb.padded_len, *(len(e.ids) for e in encoded))  # a row planned shorter than it is fits too
        ids, mask = collate([e.ids for e in encoded], width, pad_id)
        types = None
        if any(e.type_ids for e in encoded):
            types, _ = collate([e.type_ids or (0,) * len(e.ids) for e in encoded], width, 0)
        if any(e.attention for e in encoded):  # query expansion the encoder does not attend to
            mask, _ = collate([e.attention or (1,) * len(e.ids) for e in encoded], width, 0)
        routes = tuple(e.input_type for e in encoded) if task.routed else ()
        pools = tuple(e.pools for e in encoded) if any(e.pools for e in encoded) else ()
        cuts = tuple(False if e.chunking else e.max_active for e in encoded)
        renders = tuple(e.outputs for e in encoded) if any(e.outputs for e in encoded) else ()
        rows = Rows(ids, mask, tuple(e.skip for e in encoded), types, routes, pools, cuts, renders)
        results.append(list(task.forward(rows)))
        heap.release()  # what the pass freed, given back once it grew the worker (torch's heap kept it)
    forward_ms = (time.perf_counter() - start) * 1000.0
    stats = BatchStats(
        batches=0,
        texts=sum(sb.rows for sb in ran),
        real_tokens=sum(sb.real_tokens for sb in ran),
        padded_tokens=sum(sb.padded_tokens for sb in ran),
        sub_batches=len(ran),
        forward_ms=round(forward_ms, 3),
        passes=tuple((sb.rows, sb.padded_tokens) for sb in ran),
    )
    if len(ran) == len(plan.sub_batches):
        return Computed(tuple(plan.restore(results)), stats)
    outputs: list[np.ndarray | None] = [None] * len(items)
    for sb, result in zip(ran, results):
        for i, output in zip(sb.indices, result):
            outputs[i] = output
    return Computed(tuple(outputs), stats)
