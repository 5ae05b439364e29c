"""Pure planning: from token lengths to sub-batches (no torch, no I/O).

Three planners share one output contract, `Plan`:

- `plan_static`: one forward pass, every text padded to `max_length` (TorchServe's stock HF example);
- `plan_dynamic`: one forward pass padded to the longest text of the delivered batch;
  both cut a delivered batch over `sizes.UNSPLIT_TOKENS` padded tokens into consecutive passes of equal rows (in
  arrival order), so bulk requests cannot make one pass of unbounded size;
- `plan_bucketed`: texts sorted by length and cut into contiguous runs, chosen by dynamic programming
  to minimise the estimated time `sum(cost.forward(rows, padded_len))` under a token budget
  `rows * padded_len <= max_batch_tokens`. It is optimal for the cost model among plans whose
  sub-batches are runs of the length-sorted order (any optimal plan can be rearranged into one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

from bucketing.config import CostConfig
from bucketing.sizes import UNSPLIT_TOKENS

_Row = TypeVar("_Row")  # one text's result

_UNCALIBRATED = CostConfig()  # the cost model's constants have one home: the handler's config schema


def row_features(padded_len: int) -> tuple[int, int]:
    """What one row of a forward pass costs in, beyond the pass's fixed overhead: tokens, and tokens x length."""
    return padded_len, padded_len * padded_len


@dataclass(frozen=True)
class CostModel:
    """Estimated time of one forward pass: overhead + rows * (per_token * L + per_token_sq * L^2), in µs.

    The per-row terms are `row_features`; calibration fits these same features (`calibrate.fit_cost`).
    """

    overhead_us: float = _UNCALIBRATED.forward_overhead_us
    per_token_us: float = _UNCALIBRATED.per_token_us
    per_token_sq_us: float = _UNCALIBRATED.per_token_sq_us

    def row_us(self, padded_len: int) -> float:
        """Estimated microseconds one row padded to `padded_len` adds to a pass."""
        tokens, tokens_sq = row_features(padded_len)
        return self.per_token_us * tokens + self.per_token_sq_us * tokens_sq

    def forward_us(self, rows: int, padded_len: int) -> float:
        """Estimated microseconds for a forward pass over `rows` texts padded to `padded_len`."""
        return self.overhead_us + rows * self.row_us(padded_len)


@dataclass(frozen=True)
class SubBatch:
    """One forward pass: positions into the planned length list, and the length they are padded to."""

    indices: tuple[int, ...]
    padded_len: int
    real_tokens: int

    @property
    def rows(self) -> int:
        return len(self.indices)

    @property
    def padded_tokens(self) -> int:
        return self.rows * self.padded_len


@dataclass(frozen=True)
class Plan:
    """Sub-batches covering every position of the planned length list exactly once."""

    sub_batches: tuple[SubBatch, ...]
    size: int

    @property
    def real_tokens(self) -> int:
        return sum(sb.real_tokens for sb in self.sub_batches)

    @property
    def padded_tokens(self) -> int:
        return sum(sb.padded_tokens for sb in self.sub_batches)

    def estimated_us(self, cost: CostModel) -> float:
        return sum(cost.forward_us(sb.rows, sb.padded_len) for sb in self.sub_batches)

    def restore(self, results: Sequence[Sequence[_Row]]) -> list[_Row]:
        """Put per-sub-batch results (row order of each sub-batch) back in planned-list order."""
        if len(results) != len(self.sub_batches):
            raise ValueError(f"expected {len(self.sub_batches)} sub-batch results, got {len(results)}")
        out: list[_Row | None] = [None] * self.size
        for sb, rows in zip(self.sub_batches, results):
            if len(rows) != sb.rows:
                raise ValueError(f"sub-batch of {sb.rows} rows returned {len(rows)} results")
            for i, r in zip(sb.indices, rows):
                out[i] = r
        return cast(list[_Row], out)  # every index lies in one sub-batch (the plan's contract)


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= n."""
    return -(-n // multiple) * multiple


def _check_lengths(lengths: Sequence[int]) -> None:
    for i, n in enumerate(lengths):
        if n < 1:
            raise ValueError(f"lengths[{i}] = {n}: every text has at least one token")


def plan_static(lengths: Sequence[int], max_length: int, max_pass_tokens: int = UNSPLIT_TOKENS) -> Plan:
    """Every text padded to `max_length`, in arrival order: one pass, or passes of `max_pass_tokens` at most."""
    _check_lengths(lengths)
    if not lengths:
        return Plan((), 0)
    if max(lengths) > max_length:
        raise ValueError(f"a length of {max(lengths)} exceeds max_length={max_length}")
    return _in_order(lengths, max_length, max_pass_tokens, lambda chunk: max_length)


def plan_dynamic(lengths: Sequence[int], pad_to_multiple_of: int = 1, max_pass_tokens: int = UNSPLIT_TOKENS) -> Plan:
    """Padded to the longest text, in arrival order: one pass, or passes of `max_pass_tokens` at most, each padded
    to its own longest."""
    _check_lengths(lengths)
    if not lengths:
        return Plan((), 0)
    longest = round_up(max(lengths), pad_to_multiple_of)
    return _in_order(lengths, longest, max_pass_tokens, lambda chunk: round_up(max(chunk), pad_to_multiple_of))


def _in_order(
    lengths: Sequence[int], longest: int, max_pass_tokens: int, padded: Callable[[Sequence[int]], int]
) -> Plan:
    """Consecutive passes of equal rows (the last one fewer), as many rows as `longest` allows under the budget."""
    rows = max(1, max_pass_tokens // longest)
    passes = []
    for start in range(0, len(lengths), rows):
        chunk = lengths[start : start + rows]
        passes.append(SubBatch(tuple(range(start, start + len(chunk))), padded(chunk), sum(chunk)))
    return Plan(tuple(passes), len(lengths))


def plan_bucketed(
    lengths: Sequence[int],
    cost: CostModel,
    max_batch_tokens: int,
    pad_to_multiple_of: int = 1,
) -> Plan:
    """Time-optimal cut of the length-sorted texts into sub-batches under the token budget."""
    _check_lengths(lengths)
    n = len(lengths)
    if n == 0:
        return Plan((), 0)
    order = sorted(range(n), key=lengths.__getitem__)
    padded = [round_up(lengths[i], pad_to_multiple_of) for i in order]
    if padded[-1] > max_batch_tokens:
        raise ValueError(f"one text of {padded[-1]} padded tokens exceeds max_batch_tokens={max_batch_tokens}")
    # best[j]: least estimated time for the j shortest texts; cut[j]: where its last sub-batch starts.
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        length = padded[j - 1]
        per_row = cost.row_us(length)
        lowest = max(0, j - max_batch_tokens // length)
        # best[i] + overhead + (j - i) * per_row, minimised over i; overhead and j * per_row are common.
        score, start = min((best[i] - i * per_row, i) for i in range(lowest, j))
        best[j] = score + cost.overhead_us + j * per_row
        cut[j] = start
    bounds = []
    j = n
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    bounds.reverse()
    sub_batches = tuple(
        SubBatch(
            tuple(order[i:j]),
            padded[j - 1],
            sum(lengths[k] for k in order[i:j]),
        )
        for i, j in bounds
    )
    return Plan(sub_batches, n)
