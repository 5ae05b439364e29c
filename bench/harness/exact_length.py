"""Exact-length grouping in process: the same texts through the model, grouped by exact token length, no padding.

`workers` processes with `threads` torch threads each (as TorchServe's workers), started together; no padding,
no HTTP, no JSON. A reference rate (real tokens/s), not a bound: exact-length groups are small and pay more
per-pass overhead, so a configuration can run faster (the limit is the GEMM roofline, `roofline`).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from collections.abc import Callable, Sequence
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import TypedDict

from model_store.archives import SERVED

START_TIMEOUT_S = 300.0  # a worker loads the model and warms up within this, or the measurement stops
RUN_TIMEOUT_S = 600.0  # the timed passes of every worker end within this


class ExactLengthRate(TypedDict):
    """What one measurement gives (bound.json's rows beside the workload and model)."""

    tokens_per_s: float
    texts: int
    real_tokens: int
    forwards: int
    workers: int
    threads: int
    engine: str
    wall_s: float


class ExactLengthError(RuntimeError):
    """The rate could not be measured (a worker died or hung); every worker process has been ended."""


def chunks_by_length(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices grouped by exact length, each group cut to at most max_batch_tokens tokens (pure)."""
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(n, []).append(i)
    out = []
    for n, idx in sorted(groups.items()):
        step = max(1, max_batch_tokens // n)
        out += [idx[i : i + step] for i in range(0, len(idx), step)]
    return out


def balance(chunks: list[list[int]], lengths: Sequence[int], workers: int) -> list[list[list[int]]]:
    """Greedy split of chunks over workers by token count, largest first (pure)."""
    shares: list[list[list[int]]] = [[] for _ in range(workers)]
    load = [0] * workers
    for chunk in sorted(chunks, key=lambda c: -sum(lengths[i] for i in c)):
        w = load.index(min(load))
        shares[w].append(chunk)
        load[w] += sum(lengths[i] for i in chunk)
    return shares


def _worker(
    model_dir: str, threads: int, engine: str, rows: list[list[list[int]]], barrier: Barrier, out: Queue[float]
) -> None:
    """One worker: the handler's task on its share of exact-length chunks, timed after a common start."""
    import torch

    from bucketing import worker
    from bucketing.config import HandlerConfig
    from bucketing.engine_registry import ENGINES
    from bucketing.kinds.task import Rows
    from bucketing.model.encoded import collate

    torch.set_num_threads(threads)
    config = HandlerConfig(engine=ENGINES[engine].name, torch_threads=threads)
    task = worker.load(config, model_dir).task  # as the handler runs it
    for chunk in rows[:2]:
        task.forward(Rows(*collate(chunk, len(chunk[0]), 0)))
    barrier.wait(timeout=START_TIMEOUT_S)  # a sibling that died breaks the barrier instead of hanging this one
    start = time.perf_counter()
    for chunk in rows:
        task.forward(Rows(*collate(chunk, len(chunk[0]), 0)))
    out.put(time.perf_counter() - start)


def exact_length_rate(
    texts: Sequence[str],
    model_dir: str,
    workers: int = 2,
    threads: int = 1,
    max_length: int = SERVED.max_length,
    max_batch_tokens: int = SERVED.max_batch_tokens,
    engine: str = "torch",
) -> ExactLengthRate:
    """Real tokens per second of the same texts grouped by exact length (no padding), on the given engine."""
    import tempfile

    from model_store.archives import engine_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        folder = engine_model_dir(Path(model_dir), engine, "embedding", Path(tmp))
        return _rate(texts, str(folder), workers, threads, max_length, max_batch_tokens, engine)


def _rate(
    texts: Sequence[str],
    model_dir: str,
    workers: int,
    threads: int,
    max_length: int,
    max_batch_tokens: int,
    engine: str,
) -> ExactLengthRate:
    from bucketing import worker
    from bucketing.config import HandlerConfig
    from bucketing.engine_registry import ENGINES

    config = HandlerConfig(engine=ENGINES[engine].name, max_length=max_length)
    encoded = worker.load(config, model_dir).tokenizer.encode(texts)  # as the handler reads them
    lengths = [len(e.ids) for e in encoded]
    chunks = chunks_by_length(lengths, max_batch_tokens)
    shares = balance(chunks, lengths, workers)
    rows = [[[list(encoded[i].ids) for i in chunk] for chunk in share] for share in shares]
    times = run_workers(_worker, [(model_dir, threads, engine, r) for r in rows], START_TIMEOUT_S + RUN_TIMEOUT_S)
    wall = max(times)
    return {
        "tokens_per_s": sum(lengths) / wall,
        "texts": len(texts),
        "real_tokens": sum(lengths),
        "forwards": len(chunks),
        "workers": workers,
        "threads": threads,
        "engine": engine,
        "wall_s": round(wall, 3),
    }


def run_workers(target: Callable[..., None], args: Sequence[tuple[object, ...]], timeout: float) -> list[float]:
    """Run `target(*a, barrier, out)` in one spawned process per `a`, started together; each puts its seconds on
    `out`. A worker that exits without a result, or no result within `timeout`, is a ExactLengthError; on every path
    (Ctrl-C and SIGTERM included) every worker still alive is killed and reaped before this returns."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(len(args)), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, barrier, out), daemon=True) for a in args]
    try:
        for p in procs:
            p.start()
        times: list[float] = []
        deadline = time.monotonic() + timeout
        while len(times) < len(procs):
            try:
                times.append(out.get(timeout=0.5))
                continue
            except queue.Empty:
                pass
            dead = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                raise ExactLengthError(f"exact-length worker {dead[0][0]} exited with {dead[0][1]} before its result")
            if all(p.exitcode == 0 for p in procs) and out.empty():
                raise ExactLengthError("every exact-length worker exited, some without a result")
            if time.monotonic() > deadline:
                raise ExactLengthError(f"exact-length workers gave no result within {timeout:.0f} s")
        return times
    finally:
        for p in procs:  # our own children: their pids cannot be reused before we reap them below
            if p.is_alive():
                p.kill()
        for p in procs:
            if p.pid is not None:
                p.join(timeout=10)
        out.close()
        out.cancel_join_thread()
