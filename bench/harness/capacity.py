"""Capacity at a latency target: the highest open-loop arrival rate whose p99 stays within the target, no errors.

The search is pure: it is given a `measure(rate) -> Step` function and decides which rates to try. It brackets
the capacity from a starting guess (the closed-loop throughput is a good one: an open loop cannot hold more), then
bisects until the bracket is within `precision` or the step budget is spent, then repeats the deciding step: a
rate holds only if every measurement at it passed. The answer is a rate measured to hold, never an interpolation,
with its interval (`ceiling`: the lowest rate above it that missed), so two configurations rank apart only when
one's capacity is at or above the other's ceiling.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

MIN_RATE = 0.5  # req/s: below this a configuration is reported as having no capacity at the target
MAX_STEPS = 6  # open-loop steps of one search, at most (`--capacity-steps`)
STEP_S = 10.0  # seconds per step, at least (`--step-s`)
REPEATS = 2  # the deciding rate is measured this many times: it holds only if every one passes
STEP_REQUESTS = 500  # a step lasts long enough for this many arrivals (its p99 is the 5th worst)
STEP_CAP = 3  # ... and at most this many times `step_s`
START_SHARE = 0.5  # the search starts at this share of the closed-loop throughput (measured: 0.3-0.75)


@dataclass(frozen=True)
class CapacitySettings:
    """`--p99-ms` and how long the search may take per configuration."""

    target_ms: float
    max_steps: int = MAX_STEPS
    step_s: float = STEP_S

    @property
    def max_step_s(self) -> float:
        return STEP_CAP * self.step_s

    def describe(self) -> str:
        return (
            f"{self.target_ms:g} ms (capacity: at most {self.max_steps} open-loop steps, each at least "
            f"{self.step_s:g} s and long enough for {STEP_REQUESTS} arrivals, at most {self.max_step_s:g} s; "
            f"the deciding rate measured {REPEATS} times)"
        )


@dataclass(frozen=True)
class Step:
    """One open-loop measurement at `rate`."""

    rate: float
    requests: int
    ok: int
    p99_ms: float
    duration_s: float

    @property
    def errors(self) -> int:
        return self.requests - self.ok

    def passes(self, target_ms: float) -> bool:
        return self.requests > 0 and self.errors == 0 and not math.isnan(self.p99_ms) and self.p99_ms <= target_ms


@dataclass(frozen=True)
class Capacity:
    """The search's answer: the best passing step (None if none passed) and every step, in the order measured."""

    target_ms: float
    steps: tuple[Step, ...]

    def _held(self, rate: float) -> bool:
        """A rate holds when every measurement at it passed (a repeat that fails takes it back)."""
        return all(s.passes(self.target_ms) for s in self.steps if s.rate == rate)

    @property
    def best(self) -> Step | None:
        """The highest rate that held (its worst measurement, when it was repeated)."""
        held = [s for s in self.steps if self._held(s.rate)]
        if not held:
            return None
        top = max(s.rate for s in held)
        return max((s for s in held if s.rate == top), key=lambda s: s.p99_ms)

    @property
    def rate(self) -> float:
        """Requests per second held within the target (0 when no rate tried did)."""
        return self.best.rate if self.best else 0.0

    @property
    def ceiling(self) -> float | None:
        """The lowest rate above `rate` that missed the target: the capacity lies in [rate, ceiling)."""
        over = [s.rate for s in self.steps if s.rate > self.rate and not self._held(s.rate)]
        return min(over) if over else None

    def separated_from(self, other: Capacity) -> bool:
        """Whether this capacity is measured above `other`'s whole interval (a ranking that is not noise)."""
        return other.ceiling is not None and self.rate >= other.ceiling


def step_duration(rate: float, min_s: float, min_requests: int, max_s: float) -> float:
    """Long enough for `min_requests` arrivals (a stable p99 needs a few hundred), within [min_s, max_s]."""
    return max(min_s, min(max_s, min_requests / rate))


def search(
    measure: Callable[[float], Step],
    start: float,
    target_ms: float,
    max_steps: int = MAX_STEPS,
    precision: float = 0.1,
    grow: float = 1.3,
    repeats: int = REPEATS,
) -> Capacity:
    """Bracket then bisect on the rate, `max_steps` measurements at most, then measure the deciding rate until it
    has passed `repeats` times (a failure takes it back and the next rate down decides; see the docstring)."""
    if start <= 0 or target_ms <= 0:
        raise ValueError(f"start rate and target must be positive (got {start}, {target_ms})")
    steps: list[Step] = []
    lo = hi = None  # highest passing rate, lowest failing rate
    rate = round(max(start, MIN_RATE), 1)
    while len(steps) < max_steps:
        step = measure(rate)
        steps.append(step)
        if step.passes(target_ms):
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        if lo is None and hi is not None and hi <= MIN_RATE:
            break  # even the slowest rate we try misses the target
        if lo is not None and hi is not None:
            if hi / lo <= 1 + precision:
                break
            rate = math.sqrt(lo * hi)  # geometric bisection: the error is relative
        elif hi is None:
            rate = lo * grow  # type: ignore[operator]  # lo is set: every step so far passed
        else:
            # every step so far failed: back off harder when the p99 is far over the target
            over = step.p99_ms / target_ms if step.p99_ms == step.p99_ms and step.errors == 0 else 4.0
            rate = max(MIN_RATE, hi / max(1.5, min(over, 2.0)))
        rate = round(rate, 1)
        if any(abs(s.rate - rate) < 0.05 for s in steps):
            break  # nothing new to learn at this resolution
    for _ in range(repeats - 1):  # the deciding rate again: one lucky step must not set the capacity
        best = Capacity(target_ms, tuple(steps)).best
        if best is None or sum(s.rate == best.rate for s in steps) >= repeats:
            break
        steps.append(measure(best.rate))
    return Capacity(target_ms, tuple(steps))
