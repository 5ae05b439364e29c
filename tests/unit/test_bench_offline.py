"""bench.harness.offline: padded tokens per batching policy on literal batches and the sweep."""

from __future__ import annotations

from typing import cast

from bench.harness import offline
from bucketing.planning.planner import CostModel


def test_offline_policies_on_a_literal_batch():
    cost = CostModel(overhead_us=1000, per_token_us=100, per_token_sq_us=0)
    result = offline.evaluate([10, 200, 12, 190, 9, 11, 180, 14], 8, cost)
    assert result["arrival"][0] == 8 * 200
    assert result["sorted4"][0] == 4 * 12 + 4 * 200
    assert result["pow2"][0] == 5 * 14 + 3 * 200  # buckets 9-16 and 129-256
    assert result["planner"][0] <= result["sorted4"][0]
    assert result["planner"][1] <= min(ms for _, ms in result.values())


def test_offline_sweep_rows():
    rows = offline.sweep([0.2, 0.8], [8, 16], CostModel(), n=200)
    assert [(r["short_frac"], r["batch_size"]) for r in rows] == [(0.2, 8), (0.2, 16), (0.8, 8), (0.8, 16)]
    for r in cast(list[dict[str, float]], rows):  # the sweep's rows hold numbers only
        assert r["real_tokens"] <= r["planner_padded"] <= r["arrival_padded"]
        assert 0 < r["saved_vs_arrival"] < 1
