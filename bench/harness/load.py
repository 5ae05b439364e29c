"""Load generation on loopback, bounded in count and time: closed loop (N clients) and open loop (Poisson).

Open-loop latency is measured from each request's intended send time, so queueing in the client is not hidden.
The generator measures its own CPU use, so a report can say whether it was the bottleneck.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class Sample:
    """One request: when it was meant to go (s from the start), its latency, status and which body it sent."""

    sent_s: float
    latency_ms: float
    status: int
    body_index: int


@dataclass(frozen=True)
class LoadResult:
    mode: str  # "closed" or "open"
    concurrency: int | None
    rate: float | None
    samples: tuple[Sample, ...]
    wall_s: float
    client_cpu_s: float

    @property
    def client_cpu_share(self) -> float:
        """CPU seconds the load generator used per wall second (1.0 = one core)."""
        return self.client_cpu_s / self.wall_s if self.wall_s else 0.0


class Progress:
    """A one-line progress bar on stderr (a no-op when stderr is not a terminal and quiet is asked)."""

    def __init__(self, label: str, total_s: float, enabled: bool = True) -> None:
        self.label, self.total_s, self.enabled = label, total_s, enabled
        self._last = 0.0

    def update(self, elapsed_s: float, done: int, errors: int, force: bool = False) -> None:
        if not self.enabled or (not force and elapsed_s - self._last < 0.5):
            return
        self._last = elapsed_s
        frac = min(1.0, elapsed_s / self.total_s) if self.total_s else 1.0
        bar = "#" * int(frac * 30)
        end = "\n" if force else ""
        sys.stderr.write(
            f"\r  {self.label:<34} [{bar:<30}] {elapsed_s:5.1f}/{self.total_s:.0f}s {done:6d} req {errors} err{end}"
        )
        sys.stderr.flush()


HeaderFn = Callable[[], dict[str, str]]
TIMEOUT_S = 120.0  # a request's own limit, unless the load allows more


async def _send(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> int:
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            await resp.read()
            return resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return 0  # connection-level failure, reported as status 0


def _session(limit: int, timeout_s: float) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=limit, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s))


async def closed_loop(
    url: str,
    bodies: Sequence[bytes],
    headers: HeaderFn,
    concurrency: int,
    duration_s: float,
    max_requests: int,
    progress: Progress | None = None,
    timeout_s: float = TIMEOUT_S,
) -> LoadResult:
    """`concurrency` clients, each sending its next body as soon as the last answer arrives."""
    samples: list[Sample] = []
    next_index = errors = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    deadline = t0 + duration_s

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal next_index, errors
        while time.perf_counter() < deadline and next_index < max_requests:
            i = next_index
            next_index += 1
            sent = time.perf_counter()
            status = await _send(
                session, url, bodies[i % len(bodies)], {"Content-Type": "application/json", **headers()}
            )
            samples.append(Sample(sent - t0, (time.perf_counter() - sent) * 1000.0, status, i % len(bodies)))
            errors += status != 200
            if progress:
                progress.update(time.perf_counter() - t0, len(samples), errors)

    async with _session(concurrency, timeout_s) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    if progress:
        progress.update(wall, len(samples), sum(s.status != 200 for s in samples), force=True)
    return LoadResult("closed", concurrency, None, tuple(samples), wall, time.process_time() - cpu0)


async def open_loop(
    url: str,
    bodies: Sequence[bytes],
    headers: HeaderFn,
    rate: float,
    duration_s: float,
    max_requests: int,
    seed: int = 0,
    progress: Progress | None = None,
    timeout_s: float = TIMEOUT_S,
    max_in_flight: int = 2048,
) -> LoadResult:
    """Poisson arrivals at `rate` per second; latency counts from the intended send time."""
    rng = random.Random(seed)
    arrivals: list[float] = []
    t = 0.0
    while len(arrivals) < max_requests:
        t += rng.expovariate(rate)
        if t > duration_s:
            break
        arrivals.append(t)
    samples: list[Sample] = []
    cpu0, t0 = time.process_time(), time.perf_counter()
    in_flight = asyncio.Semaphore(max_in_flight)

    async def one(session: aiohttp.ClientSession, i: int, at: float) -> None:
        async with in_flight:
            status = await _send(
                session, url, bodies[i % len(bodies)], {"Content-Type": "application/json", **headers()}
            )
        samples.append(Sample(at, (time.perf_counter() - t0 - at) * 1000.0, status, i % len(bodies)))

    async with _session(max_in_flight, timeout_s) as session:
        tasks = []
        for i, at in enumerate(arrivals):
            delay = at - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, i, at)))
            if progress:
                progress.update(time.perf_counter() - t0, len(samples), 0)
        await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    if progress:
        progress.update(wall, len(samples), sum(s.status != 200 for s in samples), force=True)
    return LoadResult("open", None, rate, tuple(samples), wall, time.process_time() - cpu0)
