"""Offline (no server): padded tokens and estimated time of batching policies over one arrival stream (pure)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bench.inputs.workloads import make_workload
from bucketing.config import STRATEGY_RULES
from bucketing.planning.planner import CostModel, plan_bucketed
from model_store.archives import SERVED

Shapes = list[tuple[int, int]]  # (rows, padded length) of each forward pass
Policy = Callable[[Sequence[int]], Shapes]
POLICIES = ("arrival", "sorted4", "pow2", "planner")


def _arrival(lengths: Sequence[int]) -> Shapes:
    """Dynamic padding: the delivered batch in one pass, padded to its longest text."""
    return [(len(lengths), max(lengths))]


def _sorted4(lengths: Sequence[int]) -> Shapes:
    """Sort the delivered batch and run fixed micro-batches of 4."""
    ordered = sorted(lengths)
    return [(len(ordered[i : i + 4]), max(ordered[i : i + 4])) for i in range(0, len(ordered), 4)]


def _pow2(lengths: Sequence[int]) -> Shapes:
    """Group by power-of-two length bucket (8, 16, 32, ...); each group padded to its longest text."""
    groups: dict[int, list[int]] = {}
    for n in lengths:
        groups.setdefault(max(3, (n - 1).bit_length()), []).append(n)
    return [(len(g), max(g)) for g in groups.values()]


def policies(cost: CostModel, max_batch_tokens: int = SERVED.max_batch_tokens) -> dict[str, Policy]:
    def planner(lengths: Sequence[int]) -> Shapes:
        return [(sb.rows, sb.padded_len) for sb in plan_bucketed(lengths, cost, max_batch_tokens).sub_batches]

    return {"arrival": _arrival, "sorted4": _sorted4, "pow2": _pow2, "planner": planner}


def strategy_passes(
    strategy: str,
    lengths: Sequence[int],
    cost: CostModel,
    max_length: int = SERVED.max_length,
    max_batch_tokens: int = SERVED.max_batch_tokens,
) -> Shapes:
    """The passes one delivered batch costs under a handler strategy: static pads to max_length, dynamic is the
    `arrival` policy, bucketed the `planner` one."""
    if STRATEGY_RULES[strategy].pads_to_max_length:
        return [(len(lengths), max_length)]
    return policies(cost, max_batch_tokens)["planner" if STRATEGY_RULES[strategy].budgeted else "arrival"](lengths)


def evaluate(lengths: Sequence[int], batch_size: int, cost: CostModel) -> dict[str, tuple[int, float]]:
    """Per policy: (padded tokens, estimated ms) when `lengths` arrive in order, `batch_size` per delivery."""
    batches = [lengths[i : i + batch_size] for i in range(0, len(lengths), batch_size)]
    out = {}
    for name, policy in policies(cost).items():
        shapes = [shape for batch in batches for shape in policy(batch)]
        out[name] = (sum(r * n for r, n in shapes), sum(cost.forward_us(r, n) for r, n in shapes) / 1000.0)
    return out


def sweep(
    short_fracs: Sequence[float], batch_sizes: Sequence[int], cost: CostModel, n: int = 2000, seed: int = 0
) -> list[dict[str, object]]:
    """One row per (short_frac, batch size) of the `mixed` workload."""
    rows = []
    for frac in short_fracs:
        lengths = make_workload("mixed", n, seed, short_frac=frac).target_tokens
        for bs in batch_sizes:
            row: dict[str, object] = {"short_frac": frac, "batch_size": bs, "real_tokens": sum(lengths)}
            for name, (padded, ms) in evaluate(lengths, bs, cost).items():
                row[f"{name}_padded"] = padded
                row[f"{name}_est_s"] = round(ms / 1000.0, 1)
            row["saved_vs_arrival"] = round(1 - row["planner_padded"] / row["arrival_padded"], 3)  # type: ignore[operator]
            rows.append(row)
    return rows
