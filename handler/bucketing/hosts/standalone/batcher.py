"""An asyncio batcher per model: requests queue on the event loop, a free worker takes the next batch, and its
`serve` runs in that worker's own thread, so I/O never waits on compute.

The closing rule (`fill`): a batch takes queued requests in arrival order and closes when it holds `batch_size`
requests, or when the next request's tokens would take it past `max_batch_tokens` (a request alone is always
taken: a bulk request is its own batch), or when its first request has waited `max_delay_s` since it arrived
(TorchServe's `maxBatchDelay`; a request that waited while every worker was busy closes its batch at once with
what is queued), or at once while another worker is free too: waiting for company only pays when no other
worker could take the next request (under load every worker is busy and batches fill; at a light rate a request
does not wait the delay for nothing). Tokens are the caller's cheap estimate (the app's: body bytes / 4), never a
tokenizer call on the event loop.

Admission: at most `queue_size` requests wait (`QueueFull` past it, TorchServe's `job_queue_size`); while draining
(`drain`, SIGTERM) nothing is admitted (`Draining`) and what was admitted is run to its answer. A request whose
caller gave up (`Job.future` done) before its batch closed is skipped, never run.

Continuous batching (`handler.schedule: continuous`): `serve` answers None for a request still pending; it stays on
the worker that holds its texts (the worker's pool) and is served again in that worker's next call, with new
requests filling the free places, as TorchServe's continuous batching re-sends it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bucketing.metrics import QueueSignals


@dataclass(eq=False)
class Job:
    """One admitted request: what `serve` reads (`payload`), its estimated tokens, when it arrived, its key (the
    continuous pool's id of it) and the future its answer is set on."""

    payload: Any
    tokens: int
    arrived: float
    key: str
    future: asyncio.Future[Any]
    started: bool = False  # taken into a batch (its answer is being computed)
    prepared: Any = None  # what `serve` made of the payload once (kept across continuous calls)


class Refused(Exception):
    """A request not admitted; `reason` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class QueueFull(Refused):
    pass


class Draining(Refused):
    pass


# `serve(worker, jobs)`: one answer per job (None: pending, served again next call); run in the worker's thread.
Serve = Callable[[int, Sequence[Job]], Sequence[Any]]


def fill(
    batch: list[Job],
    tokens: int,
    queue: deque[Job],
    batch_size: int,
    max_tokens: int,
    dropped: Callable[[Job], None] | None = None,
) -> tuple[int, bool]:
    """Move jobs from the head of `queue` into `batch` by the closing rule; the batch's tokens, and whether it is
    closed (by count or tokens; the delay is the caller's). Jobs whose future is done are dropped unrun (each
    handed to `dropped`)."""
    while queue:
        if len(batch) >= batch_size:
            return tokens, True
        job = queue[0]
        if job.future.done():  # its caller gave up (a timeout) before it ran
            queue.popleft()
            if dropped is not None:
                dropped(job)
            continue
        if batch and tokens + job.tokens > max_tokens:
            return tokens, True
        queue.popleft()
        batch.append(job)
        tokens += job.tokens
    return tokens, len(batch) >= batch_size or tokens >= max_tokens


@dataclass
class Batcher:
    """The queue and workers of one model (`workers` threads, each calling `serve` with its own index)."""

    serve: Serve
    workers: int
    batch_size: int
    max_delay_s: float
    max_batch_tokens: int
    queue_size: int
    clock: Callable[[], float] = time.monotonic
    signals: QueueSignals = field(default_factory=QueueSignals)  # what an autoscaler reads (bucketing.metrics)
    queue: deque[Job] = field(default_factory=deque)
    draining: bool = False
    in_flight: int = 0  # jobs taken into batches and not yet answered
    batches: int = 0
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _executors: list[ThreadPoolExecutor] = field(default_factory=list)
    _carry: list[list[Job]] = field(default_factory=list)
    _free: int = 0  # workers in `collect` (not running a batch)
    _keys: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self._executors = [ThreadPoolExecutor(1, thread_name_prefix=f"worker-{i}") for i in range(self.workers)]
        self._carry = [[] for _ in range(self.workers)]
        self._idle.set()

    @property
    def depth(self) -> int:
        """Requests waiting for a batch."""
        return len(self.queue)

    def executor(self, worker: int) -> ThreadPoolExecutor:
        """The worker's one thread (open its model there, so that it is only ever used from it)."""
        return self._executors[worker]

    def submit(self, payload: Any, tokens: int) -> Job:
        """Admit a request (raises `QueueFull` or `Draining`); its answer is set on the job's future."""
        if self.draining:
            raise Draining("the server is shutting down and admits no new request")
        if len(self.queue) >= self.queue_size:
            raise QueueFull(f"{len(self.queue)} requests are already waiting (the queue holds {self.queue_size})")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        job = Job(payload, max(1, tokens), self.clock(), str(next(self._keys)), future)
        self.queue.append(job)
        self.signals.admitted(job.tokens)
        self._idle.clear()
        self._arrived.set()
        return job

    def start(self) -> None:
        """One task per worker, on the running loop."""
        self._tasks = [asyncio.create_task(self._run(i), name=f"batcher-{i}") for i in range(self.workers)]

    async def collect(self, worker: int = 0) -> list[Job]:
        """The worker's next batch by the closing rule (its pending jobs first, then at once what is queued); empty
        only when draining with nothing left."""
        self._free += 1
        self._arrived.set()  # a worker waiting for company re-checks: this one is free now
        try:
            return await self._collect(worker)
        finally:
            self._free -= 1

    async def _collect(self, worker: int) -> list[Job]:
        batch = list(self._carry[worker])
        self._carry[worker] = []
        async with self._lock:
            if batch:  # continuous: pending requests go on now, with whatever has arrived, counted by requests
                self._fill(batch, 0)  # only: the worker's pool serves the pending texts a slice a call, under its
                return self._taken(batch)  # own token budget (a bulk request pending must not shut others out)
            tokens = 0
            while True:
                tokens, closed = self._fill(batch, tokens)
                if closed or (batch and (self.draining or self._free > 1)):  # another worker free: no wait
                    return self._taken(batch)
                if not batch:
                    if self.draining:
                        return []
                    self._arrived.clear()
                    await self._arrived.wait()
                    continue
                left = batch[0].arrived + self.max_delay_s - self.clock()
                if left <= 0:
                    return self._taken(batch)
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except TimeoutError:
                    self._fill(batch, tokens)
                    return self._taken(batch)

    def _fill(self, batch: list[Job], tokens: int) -> tuple[int, bool]:
        return fill(batch, tokens, self.queue, self.batch_size, self.max_batch_tokens, self._dropped)

    def _dropped(self, job: Job) -> None:
        self.signals.left(job.tokens)

    def _taken(self, batch: list[Job]) -> list[Job]:
        now = self.clock()
        for job in batch:
            if not job.started:
                job.started = True
                self.in_flight += 1
                self.signals.started(job.tokens, now - job.arrived)
        return batch

    async def _run(self, worker: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self.collect(worker)
            if not batch:
                self._check_idle()
                return
            self.batches += 1
            try:
                answers: Sequence[Any] = await loop.run_in_executor(self._executors[worker], self.serve, worker, batch)
            except Exception as e:  # noqa: BLE001 - serve's own failure: every job of the batch gets it
                answers = [e] * len(batch)
            for job, answer in zip(batch, answers):
                if answer is None:  # pending (continuous): served again in this worker's next call
                    self._carry[worker].append(job)
                    continue
                self.in_flight -= 1
                self.signals.finished()
                if not job.future.done():
                    if isinstance(answer, BaseException):
                        job.future.set_exception(answer)
                    else:
                        job.future.set_result(answer)
            self._check_idle()

    def _check_idle(self) -> None:
        if not self.queue and self.in_flight == 0:
            self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """Admit nothing more and wait (at most `timeout`) until every admitted request is answered; whether all
        were."""
        self.draining = True
        self._arrived.set()  # a worker waiting for a first request sees the drain
        self._check_idle()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Stop the workers' tasks and threads (after `drain`: nothing is left to answer)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for executor in self._executors:
            executor.shutdown(wait=False, cancel_futures=True)


__all__ = ["Batcher", "Draining", "Job", "QueueFull", "Refused", "Serve", "fill"]
