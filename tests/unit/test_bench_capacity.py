"""bench.harness.capacity: the search for the highest rate within a p99 target, on a fake measure."""

from __future__ import annotations

import math

import pytest

from bench.harness import capacity


def fake_server(knee: float, target: float = 100.0):
    """p99 under the target below `knee` req/s, far over it above; every call recorded."""
    calls = []

    def measure(rate: float) -> capacity.Step:
        calls.append(rate)
        p99 = 50.0 if rate <= knee else 5000.0
        return capacity.Step(rate, int(rate * 10), int(rate * 10), p99, 10.0)

    return measure, calls


@pytest.mark.parametrize("knee, start", [(40.0, 50.0), (40.0, 10.0), (40.0, 39.0), (3.0, 80.0), (100.0, 20.0)])
def test_search_finds_a_passing_rate_near_the_knee(knee, start):
    measure, calls = fake_server(knee)
    result = capacity.search(measure, start, 100.0, max_steps=8, precision=0.1)
    assert len(calls) <= 8 + capacity.REPEATS - 1 and len(set(calls)) >= len(calls) - (capacity.REPEATS - 1)
    assert result.best is not None and result.rate <= knee  # only ever a measured, passing rate
    assert result.rate >= knee / 1.35  # bracketed within the growth step or the bisection


def test_search_with_no_passing_rate_reports_none():
    measure, calls = fake_server(0.1)
    result = capacity.search(measure, 20.0, 100.0, max_steps=10)
    assert result.best is None and result.rate == 0.0
    assert min(calls) >= capacity.MIN_RATE and calls[-1] == capacity.MIN_RATE


def test_errors_fail_a_step_even_with_a_low_p99():
    step = capacity.Step(10.0, 100, 99, 5.0, 10.0)
    assert step.errors == 1 and not step.passes(100.0)
    assert not capacity.Step(10.0, 0, 0, math.nan, 1.0).passes(100.0)


def test_step_duration_is_bounded():
    assert capacity.step_duration(100.0, 6, 300, 18) == 6
    assert capacity.step_duration(20.0, 6, 300, 18) == 15
    assert capacity.step_duration(1.0, 6, 300, 18) == 18


def test_the_deciding_rate_is_repeated_and_a_failed_repeat_takes_it_back():
    seen: dict[float, int] = {}

    def flaky(rate: float) -> capacity.Step:  # 40 req/s passes once, then fails: it does not hold
        seen[rate] = seen.get(rate, 0) + 1
        ok = rate <= 30 or (rate <= 40 and seen[rate] == 1)
        return capacity.Step(rate, 100, 100, 50.0 if ok else 900.0, 10.0)

    result = capacity.search(flaky, 40.0, 100.0, max_steps=4, repeats=2)
    assert seen[40.0] == 2 and result.rate < 40.0 and result.ceiling == 40.0


def test_rankings_are_separated_only_beyond_the_interval():
    def cap(passing: float, failing: float) -> capacity.Capacity:
        steps = (capacity.Step(passing, 100, 100, 50.0, 10.0), capacity.Step(failing, 100, 100, 900.0, 10.0))
        return capacity.Capacity(100.0, steps)

    assert cap(50, 55).separated_from(cap(40, 45))
    assert not cap(50, 55).separated_from(cap(40, 52))  # 40's capacity may lie anywhere below 52
