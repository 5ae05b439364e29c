"""Measuring one job on an entered target: warm up, load, read the figures; then its capacity at the p99 target
when one was given, and its answers' fidelity. The load is sent by a `Send` (HTTP on loopback; a fake in the
run loop's unit tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from bench.harness import capacity, load, stats
from bench.harness.capacity import START_SHARE, STEP_REQUESTS, CapacitySettings
from bench.harness.targets import Target
from bench.inputs.job import Job

WARMUP_S = 3.0
MAX_REQUESTS = 20000  # per load: bounded in count as well as time


@dataclass(frozen=True)
class Load:
    """One load to send: closed loop (`clients`) or open loop (`rate`), for `duration_s`, bounded in count."""

    url: str
    bodies: Sequence[bytes]
    headers: Callable[[], dict[str, str]]
    mode: str
    clients: int
    rate: float
    duration_s: float
    label: str
    max_requests: int = MAX_REQUESTS  # fewer: a fixed count (the bulk kind's one request, its split requests)


class Send(Protocol):
    def __call__(self, spec: Load) -> load.LoadResult: ...


def send_http(seed: int, progress: bool) -> Send:
    """The real load: `load.open_loop` or `load.closed_loop` over HTTP."""

    def send(spec: Load) -> load.LoadResult:
        bar = load.Progress(spec.label, spec.duration_s, progress)
        if spec.mode == "open":
            return asyncio.run(
                load.open_loop(
                    spec.url, spec.bodies, spec.headers, spec.rate, spec.duration_s, spec.max_requests, seed, bar
                )
            )
        timeout = max(load.TIMEOUT_S, spec.duration_s)  # a bulk request's load: as long as it is allowed to take
        return asyncio.run(
            load.closed_loop(
                spec.url, spec.bodies, spec.headers, spec.clients, spec.duration_s, spec.max_requests, bar, timeout
            )
        )

    return send


class Measurer:
    """Measures jobs on targets; keeps the token counts of everything measured that was sent (the report's
    histogram, per workload)."""

    def __init__(self, send: Send, settings: CapacitySettings | None = None, warmup_s: float = WARMUP_S) -> None:
        self.send, self.settings, self.warmup_s = send, settings, warmup_s
        self.sent: dict[str, list[int]] = {}

    def _load(self, job: Job, target: Target, bodies: Sequence[bytes], duration: float, label: str) -> load.LoadResult:
        c = job.config
        spec = Load(target.url, bodies, target.headers, c.mode, c.concurrency, c.rate or 1.0, duration, label)
        return self.send(spec)

    def _count(self, job: Job, result: load.LoadResult) -> None:
        self.sent.setdefault(job.config.workload_label, []).extend(job.load.sent(result.samples))

    def measure(self, job: Job, target: Target) -> stats.Summary:
        """Warm up, load, read the figures; then the capacity search when a p99 target was given; then fidelity."""
        config, bodies = job.config, target.bodies(job)
        clients = min(config.concurrency, 2 * config.batch_size * config.workers)
        warm = replace(job, config=replace(config, mode="closed", concurrency=clients))
        self._load(warm, target, bodies[::-1], self.warmup_s, f"{config.name} warm-up")
        before, cpu0 = target.counters(), target.cpu()
        result = self._load(job, target, bodies, config.duration, config.name)
        after, cpu1 = target.counters(), target.cpu()
        self._count(job, result)
        tokens = job.load.tokens
        samples = [(s.latency_ms, s.status, tokens[s.body_index]) for s in result.samples]
        summary = stats.summarize(
            config,
            samples,
            result.wall_s,
            stats.handler_delta(before, after),
            result.client_cpu_s,
            (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
            job.exact_tps,
            engine=target.engine,
            device=target.device,
        )
        summary = replace(summary, roofline_tokens_per_s=job.roofline_tps, worker_peak_rss_mb=target.peak_rss_mb())
        if self.settings:
            start = (config.rate or 1.0) if config.mode == "open" else START_SHARE * summary.rps
            summary = replace(summary, capacity=self._capacity(job, target, bodies, start, self.settings))
        return replace(summary, min_cosine=target.fidelity(job))

    def _capacity(
        self, job: Job, target: Target, bodies: Sequence[bytes], start: float, settings: CapacitySettings
    ) -> capacity.Capacity:
        """The highest open-loop rate within the p99 target (each step's requests are reported)."""
        config = job.config

        def step(rate: float) -> capacity.Step:
            duration = capacity.step_duration(rate, settings.step_s, STEP_REQUESTS, settings.max_step_s)
            opened = replace(job, config=replace(config, mode="open", rate=rate))
            r = self._load(opened, target, bodies, duration, f"{config.name} @{rate:g}/s")
            self._count(job, r)
            ok = [s.latency_ms for s in r.samples if s.status == 200]
            result = capacity.Step(rate, len(r.samples), len(ok), stats.percentile(ok, 99), r.wall_s)
            verdict = "within" if result.passes(settings.target_ms) else "over"
            print(
                f"  capacity step {rate:g} req/s: {result.requests} requests, p99 {result.p99_ms:.0f} ms, "
                f"{result.errors} errors: {verdict} {settings.target_ms:g} ms"
            )
            return result

        return capacity.search(step, max(start, capacity.MIN_RATE), settings.target_ms, settings.max_steps)
