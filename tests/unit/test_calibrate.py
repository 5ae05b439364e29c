"""Cost-model fitting from timed forward passes (pure: fake timings)."""

from __future__ import annotations

import pytest

from bucketing.planning.calibrate import SHAPES, fit_cost, measure
from bucketing.planning.planner import CostModel

FALLBACK = CostModel(1.0, 2.0, 3.0)


def test_fit_recovers_the_constants_of_exact_timings():
    truth = CostModel(overhead_us=4000, per_token_us=200, per_token_sq_us=0.3)
    samples = [(r, n, truth.forward_us(r, n)) for r, n in SHAPES]
    fitted = fit_cost(samples, FALLBACK)
    assert fitted.overhead_us == pytest.approx(4000, rel=1e-6)
    assert fitted.per_token_us == pytest.approx(200, rel=1e-6)
    assert fitted.per_token_sq_us == pytest.approx(0.3, rel=1e-6)


def test_fit_keeps_coefficients_non_negative():
    # time that falls with length would need a negative quadratic term: it is dropped instead
    samples = [(r, n, 1000 + 100 * r * n - 0.5 * r * n * n) for r, n in [(1, 8), (1, 32), (1, 64), (4, 16)]]
    fitted = fit_cost(samples, FALLBACK)
    assert min(fitted.overhead_us, fitted.per_token_us, fitted.per_token_sq_us) >= 0


def test_fit_falls_back_on_too_few_or_bad_samples():
    assert fit_cost([(1, 8, 10.0)], FALLBACK) is FALLBACK
    assert fit_cost([(1, 8, 0.0), (1, 16, 1.0), (2, 8, 1.0)], FALLBACK) is FALLBACK


def test_measure_times_only_shapes_within_max_length():
    calls = []
    samples = measure(lambda rows, n: calls.append((rows, n)), max_length=64, repeats=2)
    assert {(r, n) for r, n, _ in samples} == {(r, n) for r, n in SHAPES if n <= 64}
    assert len(calls) == 3 * len(samples)  # one warm-up and two timed runs each
