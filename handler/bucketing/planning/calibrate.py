"""Fit the planner's cost model to a few timed forward passes (the fit is pure; timing takes a callable)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from bucketing.planning.planner import CostModel, row_features

# (rows, padded length) pairs timed at worker start: a spread of shapes, about 2k tokens in all.
SHAPES = ((1, 8), (1, 32), (1, 128), (8, 16), (8, 64), (4, 128), (16, 32), (2, 256))

Sample = tuple[int, int, float]  # rows, padded length, microseconds


def measure(
    forward: Callable[[int, int], object],
    max_length: int,
    repeats: int = 3,
    shapes: Sequence[tuple[int, int]] = SHAPES,
) -> list[Sample]:
    """Median time of `forward(rows, length)` for each shape that fits max_length (after one warm-up)."""
    samples = []
    for rows, length in shapes:
        if length > max_length:
            continue
        forward(rows, length)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            forward(rows, length)
            times.append((time.perf_counter() - start) * 1e6)
        samples.append((rows, length, float(np.median(times))))
    return samples


def fit_cost(samples: Sequence[Sample], fallback: CostModel) -> CostModel:
    """Least squares on relative error, coefficients kept non-negative; `fallback` if the fit is unusable."""
    if len(samples) < 3:
        return fallback
    rows = np.array([s[0] for s in samples], dtype=float)
    length = np.array([s[1] for s in samples], dtype=float)
    t = np.array([s[2] for s in samples], dtype=float)
    if np.any(t <= 0):
        return fallback
    per_row = np.array([row_features(int(n)) for n in length], dtype=float)
    columns = np.concatenate([np.ones((len(t), 1)), rows[:, None] * per_row], axis=1)
    active = [0, 1, 2]
    coef = np.zeros(3)
    while active:
        a = columns[:, active] / t[:, None]
        solution, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        if np.all(solution >= 0):
            coef[active] = solution
            break
        active = [c for c, v in zip(active, solution) if v > 0]
    if coef[1] <= 0 and coef[2] <= 0:
        return fallback
    return CostModel(overhead_us=float(coef[0]), per_token_us=float(coef[1]), per_token_sq_us=float(coef[2]))
