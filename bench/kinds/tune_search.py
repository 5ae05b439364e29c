"""`--suite tune`, the pure parts: candidate configurations ranked and pruned by the offline planner's estimates,
and the measuring order under a time budget (the choice of a winner and the YAML that deploys it: `tune_choice`).

Estimates come from the planner's cost model of each candidate's engine and dtype (`engine_dtypes`: every engine
in float32, a reduced dtype on the engines that run it; each calibrated on this machine) over the workload's real
token lengths, delivered `batch_size` at a time: each strategy's forward passes (static pads to max_length, dynamic
to the batch's longest text, bucketed runs the planner's sub-batches), their estimated time, and so an estimated
saturated throughput per worker layout, and a latency floor (a request's own pass, 99th percentile over the texts,
plus the batch delay: no configuration does better). They rank and prune; measurement decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from bench.harness.offline import strategy_passes
from bench.harness.stats import Summary, percentile
from bench.inputs.configuration import Configuration
from bucketing.config import SCHEDULE_RULES, STRATEGIES, STRATEGY_RULES
from bucketing.planning.planner import CostModel
from model_store.archives import SERVED

BATCH_SIZES = (1, 4, 8, 16, 32)
DELAYS = (5, 10, 20, 50)
THREAD_EFFICIENCY = 0.8  # each extra thread in one worker adds this much of a core's speed (a rough prior)
PRUNE_BELOW = 0.5  # candidates estimated under this share of the best estimate are not measured
RESERVE_S = 60.0  # budget kept back beyond the next measurement, for recommending (building, re-measuring)
REDUCED = "bfloat16"  # the reduced-precision dtype the suite may consider (a native-bf16 CPU, engines that run it)
FLOAT32 = "float32"

Pair = tuple[str, str]  # (engine, dtype), each with its own calibrated cost model


@dataclass(frozen=True)
class Candidate:
    """One (strategy, batch size, workers x threads) at the default delay, with its offline estimates."""

    config: Configuration
    est_rps: float
    est_floor_ms: float  # a lower bound on p99: a request's own pass (p99 over the texts) plus the batch delay
    pruned: str = ""  # why it is not measured ("" when kept)


def layouts(cores: int) -> list[tuple[int, int]]:
    """Worker layouts that use every core: workers x threads = cores (and 1 x 1)."""
    out = [(w, cores // w) for w in range(1, cores + 1) if cores % w == 0]
    return sorted(set(out) | {(1, 1)}, key=lambda wt: (-wt[0] * wt[1], -wt[0]))


def estimate(
    base: Configuration,
    lengths: Sequence[int],
    cost: CostModel,
    max_length: int = SERVED.max_length,
    max_batch_tokens: int = SERVED.max_batch_tokens,
) -> tuple[float, float]:
    """(requests/s, latency floor in ms) of `base` on texts of these token lengths, from the cost model."""
    bs = base.batch_size
    batches = [lengths[i : i + bs] for i in range(0, len(lengths), bs)]
    speed = 1 + THREAD_EFFICIENCY * (base.threads - 1)

    def ms(batch: Sequence[int]) -> float:
        passes = strategy_passes(base.strategy, batch, cost, max_length, max_batch_tokens)
        return sum(cost.forward_us(r, n) for r, n in passes) / 1000 / speed

    rps = base.workers * len(lengths) / (sum(ms(b) for b in batches) / 1000)
    alone = [ms([t]) for t in lengths]  # a lower bound on p99: each request's own pass, plus the batch delay
    floor = percentile(alone, 99) + (base.max_batch_delay if bs > 1 else 0)
    return rps, floor


def engine_dtypes(served: Mapping[str, Sequence[str]], reduced: Sequence[str]) -> list[Pair]:
    """The (engine, dtype) pairs the suite calibrates and estimates: float32 on every engine (`served`: each engine
    with the dtypes it runs on this CPU, as the engines registry says), and each reduced dtype considered
    (`reduced_dtypes`) on each engine that runs it."""
    pairs = [(engine, FLOAT32) for engine in served]
    pairs += [(engine, dtype) for dtype in reduced for engine, dtypes in served.items() if dtype in dtypes]
    return pairs


def candidates(
    base: Configuration,
    lengths: Sequence[int],
    costs: CostModel | Mapping[Pair, CostModel],
    target_ms: float,
    cores: int,
    strategies: Sequence[str] = STRATEGIES,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    schedules: Sequence[str] = ("batch",),
) -> list[Candidate]:
    """Every (strategy, batch size, layout, schedule, engine, dtype) at `base`'s delay, best estimate first, each
    estimated with its own engine and dtype's cost model; the hopeless ones marked pruned (against the best of their
    dtype: float32 stays measured beside a faster reduced dtype, in case it misses its floor). The estimates do not
    tell schedules apart (they model TorchServe's batches): measurement does. `costs`: the calibrated cost model of
    each (engine, dtype) to consider (a lone cost model: float32 on `base`'s engine)."""
    by_pair: dict[tuple[str | None, str], CostModel] = (
        {(base.engine, FLOAT32): costs} if isinstance(costs, CostModel) else {pair: c for pair, c in costs.items()}
    )
    out = []
    for strategy in strategies:
        for bs in batch_sizes:
            rule = STRATEGY_RULES[strategy]
            if (
                bs == 1
                and rule.pads_to_longest
                and not rule.budgeted
                and any(STRATEGY_RULES[s].budgeted for s in strategies)
            ):
                continue  # one text a batch: dynamic and bucketed run the very same pass
            for workers, threads in layouts(cores):
                for schedule in schedules:
                    if SCHEDULE_RULES[schedule].pools and workers > 1:
                        continue  # one worker a model under continuous (TorchServe 0.12's queue lock)
                    for (engine, dtype), cost in by_pair.items():
                        config = replace(
                            base,
                            strategy=strategy,
                            batch_size=bs,
                            workers=workers,
                            threads=threads,
                            schedule=schedule if SCHEDULE_RULES[schedule].pools else None,
                            dtype=None if dtype == FLOAT32 else dtype,
                            engine=engine,
                        )
                        rps, floor = estimate(config, lengths, cost)
                        out.append(Candidate(config, rps, floor))
    best_of: dict[str | None, float] = {}  # per dtype: float32 stays measured, in case bfloat16 misses its floor
    for c in out:
        best_of[c.config.dtype] = max(best_of.get(c.config.dtype, 0.0), c.est_rps)
    pruned = []
    for c in out:
        why, best = "", best_of[c.config.dtype]
        if c.est_floor_ms > target_ms:
            why = f"estimated latency floor {c.est_floor_ms:.0f} ms > target {target_ms:g} ms"
        elif c.est_rps < PRUNE_BELOW * best:
            why = f"estimated {c.est_rps:.0f} req/s < {PRUNE_BELOW:g} x the best estimate of its dtype ({best:.0f})"
        pruned.append(replace(c, pruned=why))
    return sorted(pruned, key=lambda c: -c.est_rps)


def first_round(ranked: Sequence[Candidate]) -> list[Configuration]:
    """The measuring order before delays: the best kept candidate of each (engine, dtype), then of each strategy
    (and schedule and dtype), then the rest by estimate."""
    kept = [c for c in ranked if not c.pruned]
    heads: list[Configuration] = []
    for key in (engine_dtype, lambda c: (c.strategy, c.schedule, c.dtype)):
        for kind in dict.fromkeys(key(c.config) for c in kept):
            head = next(c.config for c in kept if key(c.config) == kind)
            if head not in heads:
                heads.append(head)
    return heads + [c.config for c in kept if c.config not in heads]


def engine_dtype(config: Configuration) -> tuple[str | None, str]:
    return config.engine, config.dtype or FLOAT32


def delay_variants(best: Configuration, delays: Sequence[int] = DELAYS) -> list[Configuration]:
    """The best configuration at the other batch delays (none for batch size 1: it never waits)."""
    if best.batch_size == 1:
        return []
    return [replace(best, max_batch_delay=d) for d in delays if d != best.max_batch_delay]


def faithful(s: Summary, min_cosine: float | None) -> bool:
    """Whether a measured configuration may win: float32 always; a reduced dtype only when its answers' cosine min
    against float32 (measured on the run's texts) reaches the user's floor."""
    if s.config.dtype in (None, "float32"):
        return True
    return min_cosine is not None and s.min_cosine is not None and s.min_cosine >= min_cosine


def rank(summaries: Sequence[Summary], min_cosine: float | None = None) -> list[Summary]:
    """Best first: capacity at the target, then closed-loop throughput (each configuration once: its lowest
    capacity when it was measured again); a reduced dtype below the `min_cosine` floor is left out."""
    return best_first([s for s in summaries if faithful(s, min_cosine)])


def best_first(summaries: Sequence[Summary]) -> list[Summary]:
    lowest: dict[Configuration, Summary] = {}
    for s in summaries:
        key = replace(s.config, label="")
        if key not in lowest or capacity_rate(s) < capacity_rate(lowest[key]):
            lowest[key] = s
    return sorted(lowest.values(), key=lambda s: (-capacity_rate(s), -s.rps))


def capacity_rate(s: Summary) -> float:
    return s.capacity.rate if s.capacity else 0.0


def separated(winner: Summary, runner_up: Summary) -> bool:
    """Whether the winner's capacity lies above the runner-up's whole interval (a ranking that is not noise)."""
    return bool(winner.capacity and runner_up.capacity and winner.capacity.separated_from(runner_up.capacity))


@dataclass
class Budget:
    """The suite's time budget, and what each measurement has cost so far (to decide what still fits)."""

    total_s: float
    costs: list[float] = field(default_factory=list)

    def expected(self, default_s: float) -> float:
        """What the next measurement will cost: the dearest so far (measurements differ mostly by start-up)."""
        return max(self.costs) if self.costs else default_s

    def fits(self, elapsed_s: float, default_s: float, reserve_s: float = 0.0) -> bool:
        return elapsed_s + self.expected(default_s) + reserve_s <= self.total_s


class MeasureFailed(Exception):
    """A candidate that could not be measured (its worker did not start, ...): skipped with this reason."""


def explore(
    ranked: Sequence[Candidate],
    measure: Callable[[Configuration], Summary],
    budget: Budget,
    default_cost_s: float,
    elapsed: Callable[[], float],
    delays: Sequence[int] = DELAYS,
    min_cosine: float | None = None,
) -> tuple[list[Summary], list[tuple[Configuration, str]]]:
    """Measure the kept candidates in `first_round` order while the budget holds; once the best of each engine and
    dtype and of each strategy have been seen (or the queue runs dry), the best so far at the other delays goes
    first. Returns what was measured, in order, and what was skipped, with why."""
    kept = [c for c in ranked if not c.pruned]
    queue = first_round(ranked)
    delays_after = len({c.config.strategy for c in kept}) + len({engine_dtype(c.config) for c in kept}) + 1
    measured: list[Summary] = []
    skipped: list[tuple[Configuration, str]] = []
    delays_done = False
    while queue or (not delays_done and measured):
        if not delays_done and measured and (len(measured) >= delays_after or not queue):
            ranking = rank(measured, min_cosine)
            queue = (delay_variants(ranking[0].config, delays) if ranking else []) + queue
            delays_done = True
            continue
        config = queue.pop(0)
        expected = budget.expected(default_cost_s)
        if not budget.fits(elapsed(), default_cost_s, reserve_s=expected + RESERVE_S):
            skipped.append((config, f"budget (about {expected:.0f} s each)"))
            continue
        started = elapsed()
        try:
            measured.append(measure(config))
        except MeasureFailed as e:
            skipped.append((config, f"failed: {str(e)[:120]}"))
        finally:
            budget.costs.append(elapsed() - started)
    return measured, skipped
