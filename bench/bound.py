"""The padding-free bound: the same texts through the model in process, grouped by exact token length.

`workers` processes with `threads` torch threads each (as TorchServe's workers), started together; no padding,
no HTTP, no JSON: the best real tokens/s this machine reaches with this model.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


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


def _worker(model_dir: str, threads: int, engine: str, rows: list[list[list[int]]], barrier: Any, out: Any) -> None:
    import torch

    from bucketing.config import HandlerConfig
    from bucketing.tasks import load_task
    from bucketing.tokenizer import collate

    torch.set_num_threads(threads)
    task = load_task(HandlerConfig(engine=engine, torch_threads=threads), model_dir)  # as the handler runs it
    for chunk in rows[:2]:
        task.forward(*collate(chunk, len(chunk[0]), 0))
    barrier.wait()
    start = time.perf_counter()
    for chunk in rows:
        task.forward(*collate(chunk, len(chunk[0]), 0))
    out.put(time.perf_counter() - start)


def padding_free_bound(
    texts: Sequence[str], model_dir: str, workers: int = 2, threads: int = 1, max_length: int = 256,
    max_batch_tokens: int = 8192, engine: str = "torch",
) -> dict[str, Any]:  # fmt: skip
    """Real tokens per second of the same texts grouped by exact length (no padding), on the given engine."""
    import tempfile

    from model_store.archives import engine_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        folder = engine_model_dir(Path(model_dir), engine, "embedding", Path(tmp))
        return _bound(texts, str(folder), workers, threads, max_length, max_batch_tokens, engine)


def _bound(
    texts: Sequence[str], model_dir: str, workers: int, threads: int, max_length: int, max_batch_tokens: int,
    engine: str,
) -> dict[str, Any]:  # fmt: skip
    from bucketing.tokenizer import Tokenizer

    encoded = Tokenizer(model_dir, max_length).encode(texts)
    lengths = [len(e.ids) for e in encoded]
    chunks = chunks_by_length(lengths, max_batch_tokens)
    shares = balance(chunks, lengths, workers)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(workers), ctx.Queue()
    rows = [[[list(encoded[i].ids) for i in chunk] for chunk in share] for share in shares]
    procs = [ctx.Process(target=_worker, args=(model_dir, threads, engine, r, barrier, out)) for r in rows]
    for p in procs:
        p.start()
    times = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
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


def calibrated_cost(model_dir: str, engine: str, max_length: int = 256) -> Any:
    """The planner's cost model fitted to this machine: the handler's own calibration, one thread, in process."""
    import tempfile

    import numpy as np
    import torch

    from bucketing.calibrate import fit_cost, measure
    from bucketing.config import HandlerConfig
    from bucketing.planner import CostModel
    from bucketing.tasks import load_task
    from model_store.archives import engine_model_dir

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = engine_model_dir(Path(model_dir), engine, "embedding", Path(tmp))
        task = load_task(HandlerConfig(engine=engine, torch_threads=1), str(folder))

        def forward(rows: int, length: int) -> None:
            task.forward(np.full((rows, length), 1000, dtype=np.int64), np.ones((rows, length), dtype=np.int64))

        return fit_cost(measure(forward, max_length), CostModel())
