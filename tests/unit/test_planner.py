"""The planner: literal cases and properties (every index once, budget held, order restorable, optimal)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketing.planning.planner import CostModel, Plan, plan_bucketed, plan_dynamic, plan_static, round_up

COST = CostModel(overhead_us=5000, per_token_us=230, per_token_sq_us=0.2)


def covered(plan: Plan) -> list[int]:
    return sorted(i for sb in plan.sub_batches for i in sb.indices)


def test_empty_batch_gives_empty_plan():
    for plan in (plan_static([], 16), plan_dynamic([]), plan_bucketed([], COST, 100)):
        assert plan.sub_batches == () and plan.size == 0


def test_static_pads_everything_to_max_length_in_arrival_order():
    plan = plan_static([3, 9, 1], max_length=16)
    (sb,) = plan.sub_batches
    assert sb.indices == (0, 1, 2) and sb.padded_len == 16
    assert plan.real_tokens == 13 and plan.padded_tokens == 48


def test_static_refuses_a_text_longer_than_max_length():
    with pytest.raises(ValueError, match="max_length=8"):
        plan_static([9], max_length=8)


def test_dynamic_pads_to_longest_and_rounds_to_multiple():
    assert plan_dynamic([3, 9, 1]).sub_batches[0].padded_len == 9
    assert plan_dynamic([3, 9, 1], pad_to_multiple_of=8).sub_batches[0].padded_len == 16


def test_bucketed_separates_short_from_long():
    lengths = [200, 8, 9, 210, 10, 8]
    plan = plan_bucketed(lengths, COST, max_batch_tokens=8192)
    groups = [sorted(lengths[i] for i in sb.indices) for sb in plan.sub_batches]
    assert groups == [[8, 8, 9, 10], [200, 210]]
    assert plan.padded_tokens == 4 * 10 + 2 * 210


def test_bucketed_keeps_one_pass_when_overhead_dominates():
    expensive_call = CostModel(overhead_us=1e9, per_token_us=1, per_token_sq_us=0)
    plan = plan_bucketed([5, 50, 7], expensive_call, max_batch_tokens=1000)
    assert len(plan.sub_batches) == 1 and plan.sub_batches[0].padded_len == 50


def test_bucketed_runs_each_text_alone_when_calls_are_free():
    free_call = CostModel(overhead_us=0, per_token_us=1, per_token_sq_us=0)
    plan = plan_bucketed([5, 50, 7], free_call, max_batch_tokens=1000)
    assert plan.padded_tokens == plan.real_tokens == 62


def test_bucketed_holds_the_token_budget_by_splitting_equal_lengths():
    plan = plan_bucketed([100] * 10, COST, max_batch_tokens=300)
    assert [sb.rows for sb in plan.sub_batches] == [3, 3, 3, 1] or all(
        sb.padded_tokens <= 300 for sb in plan.sub_batches
    )
    assert all(sb.padded_tokens <= 300 for sb in plan.sub_batches) and len(plan.sub_batches) == 4


def test_bucketed_refuses_a_text_over_the_budget():
    with pytest.raises(ValueError, match="max_batch_tokens=64"):
        plan_bucketed([65], COST, max_batch_tokens=64)


def test_lengths_must_be_positive():
    with pytest.raises(ValueError, match=r"lengths\[1\] = 0"):
        plan_bucketed([3, 0], COST, 100)


def test_restore_puts_results_back_in_request_order():
    lengths = [30, 2, 17, 2, 90]
    plan = plan_bucketed(lengths, COST, max_batch_tokens=512)
    results = [[f"out{i}" for i in sb.indices] for sb in plan.sub_batches]
    assert plan.restore(results) == [f"out{i}" for i in range(5)]


def test_restore_checks_counts():
    plan = plan_dynamic([3, 4])
    with pytest.raises(ValueError, match="2 rows returned 1"):
        plan.restore([["only one"]])
    with pytest.raises(ValueError, match="expected 1 sub-batch"):
        plan.restore([])


def brute_force_best(lengths: list[int], cost: CostModel, budget: int, multiple: int) -> float:
    """Least estimated time over every cut of the sorted lengths (exponential: small inputs only)."""
    ordered = sorted(lengths)
    n = len(ordered)
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        total = 0.0
        for i, j in itertools.pairwise(bounds):
            padded = round_up(ordered[j - 1], multiple)
            if (j - i) * padded > budget:
                total = float("inf")
                break
            total += cost.forward_us(j - i, padded)
        best = min(best, total)
    return best


lengths_st = st.lists(st.integers(min_value=1, max_value=256), min_size=1, max_size=64)
cost_st = st.builds(
    CostModel,
    overhead_us=st.floats(0, 1e5),
    per_token_us=st.floats(0.01, 1e3),
    per_token_sq_us=st.floats(0, 10),
)


@given(lengths=lengths_st, cost=cost_st, budget=st.integers(256, 20000), multiple=st.sampled_from([1, 8]))
@settings(max_examples=300, deadline=None)
def test_bucketed_properties(lengths, cost, budget, multiple):
    plan = plan_bucketed(lengths, cost, budget, multiple)
    assert covered(plan) == list(range(len(lengths)))  # every index exactly once
    for sb in plan.sub_batches:
        assert sb.padded_tokens <= budget  # budget held
        assert sb.padded_len == round_up(max(lengths[i] for i in sb.indices), multiple)
        assert sb.padded_len % multiple == 0
        assert sb.real_tokens == sum(lengths[i] for i in sb.indices)
    assert plan.restore([list(sb.indices) for sb in plan.sub_batches]) == list(range(len(lengths)))
    assert plan.real_tokens == sum(lengths) <= plan.padded_tokens
    # never worse than one pass padded to the longest (when that fits the budget)
    single = plan_dynamic(lengths, multiple)
    if single.padded_tokens <= budget:
        assert plan.estimated_us(cost) <= single.estimated_us(cost) * (1 + 1e-9)


@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=9),
    cost=cost_st,
    budget=st.integers(64, 400),
    multiple=st.sampled_from([1, 4]),
)
@settings(max_examples=200, deadline=None)
def test_bucketed_is_optimal_for_its_cost_model(lengths, cost, budget, multiple):
    plan = plan_bucketed(lengths, cost, budget, multiple)
    assert plan.estimated_us(cost) == pytest.approx(brute_force_best(lengths, cost, budget, multiple), rel=1e-9)


@given(lengths=lengths_st, max_length=st.integers(256, 512))
def test_static_and_dynamic_cover_every_index_in_order(lengths, max_length):
    for plan in (plan_static(lengths, max_length), plan_dynamic(lengths)):
        assert covered(plan) == list(range(len(lengths)))
        assert plan.sub_batches[0].indices == tuple(range(len(lengths)))


def test_plans_a_large_batch():
    import random

    rng = random.Random(0)
    lengths = [rng.randint(3, 256) for _ in range(2048)]
    plan = plan_bucketed(lengths, COST, 8192)
    assert covered(plan) == list(range(2048))
    assert all(sb.padded_tokens <= 8192 for sb in plan.sub_batches)
