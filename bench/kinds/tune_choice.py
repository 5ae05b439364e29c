"""`--suite tune`, the pure parts after measuring: the result (`TuneResult`), why the winner has its engine and dtype,
the model-config YAML that deploys it and what TorchServe applied of it, and each engine and dtype as calibrated
(`EngineCost`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bench.harness.offline import strategy_passes
from bench.harness.stats import Summary
from bench.inputs.configuration import Configuration
from bench.kinds.tune_search import (
    FLOAT32,
    REDUCED,
    Candidate,
    Pair,
    estimate,
    faithful,
    rank,
)
from bench.kinds.tune_search import best_first as _ranked
from bench.kinds.tune_search import capacity_rate as _cap
from bench.kinds.tune_search import engine_dtype as _engine_dtype
from bucketing.planning.planner import CostModel
from model_store import archives
from model_store.archives import SERVED


@dataclass(frozen=True)
class TuneResult:
    """What the tune suite found, for the report."""

    target_ms: float
    budget_s: float
    elapsed_s: float
    candidates: tuple[Candidate, ...]
    measured: tuple[Summary, ...]  # in the order measured
    skipped: tuple[tuple[Configuration, str], ...]  # measured-worthy but left out, with why
    yaml_name: str = ""
    yaml_text: str = ""
    commands: tuple[str, ...] = ()
    remeasured: Summary | None = None  # the winner again, registered from its YAML
    applied: tuple[str, ...] = ()  # where TorchServe's describe differed from the YAML (empty: all applied)
    min_cosine: float | None = None  # the user's fidelity floor for a reduced dtype (None: float32 only)
    engine_costs: tuple[EngineCost, ...] = ()  # each (engine, dtype) as calibrated, with the base load's plan on it
    base: Configuration | None = None  # the load the engines' plans are shown for (strategy, batch size, layout)

    @property
    def ranking(self) -> list[Summary]:
        return rank(self.measured, self.min_cosine)


def reduced_dtypes(min_cosine: float | None, native: str | None) -> tuple[tuple[str, ...], str]:
    """The reduced dtypes the suite considers, and why, in a line for its YAML: bfloat16 only with a fidelity floor
    (`--min-cosine`) on a CPU that multiplies it natively (`native`: the flag that says so, None where it would
    emulate it)."""
    if min_cosine is None:
        return (), "float32 only: bfloat16 is considered only with a fidelity floor (--min-cosine)"
    if native is None:
        return (), (
            f"float32 only: --min-cosine {min_cosine:g} given, but this CPU has no native bfloat16 "
            "(it would emulate it, slower than float32)"
        )
    return (REDUCED,), f"float32 and {REDUCED} ({native}); {REDUCED} eligible at cosine min >= {min_cosine:g}"


def dtype_choice(measured: Sequence[Summary], min_cosine: float | None, considered: str) -> str:
    """Why the winner has its dtype, in a line for the YAML: what was considered, and the best of each dtype."""
    ranking = rank(measured, min_cosine)
    if not ranking:
        return considered
    winner = ranking[0]
    reduced = [s for s in measured if s.config.dtype not in (None, "float32")]
    if not reduced:
        return f"dtype {winner.config.dtype or 'float32'}: {considered}"
    floats = [s for s in ranking if s.config.dtype in (None, "float32")]
    best_float = f"float32's best capacity {fmt_rate(_cap(floats[0]))}" if floats else "no float32 measured"
    eligible = [s for s in ranking if s.config.dtype not in (None, "float32")]
    cosines = [s.min_cosine for s in reduced if s.min_cosine is not None]
    fidelity = f"cosine min {min(cosines):.6f}" if cosines else "fidelity not measured"
    if not eligible:
        return f"dtype float32: {REDUCED} measured at {fidelity}, below the floor {min_cosine}; {best_float}"
    best_reduced = f"{REDUCED}'s best capacity {fmt_rate(_cap(eligible[0]))} ({fidelity}, floor {min_cosine:g})"
    return f"dtype {winner.config.dtype or 'float32'}: {best_reduced} against {best_float}"


def model_config(winner: Configuration, template: dict[str, Any], min_cosine: float | None = None) -> dict[str, Any]:
    """The model-config YAML that deploys `winner`: the template with its TorchServe and handler settings, its engine
    and dtype named (a reduced dtype with the user's fidelity floor, which its workers then check at start)."""
    cfg = dict(template)
    cfg.update(
        minWorkers=winner.workers,
        maxWorkers=winner.workers,
        batchSize=winner.batch_size,
        maxBatchDelay=winner.max_batch_delay,
    )
    handler = dict(cfg.get("handler") or {})
    handler.update(strategy=winner.strategy, torch_threads=winner.threads)
    if winner.engine:
        handler["engine"] = winner.engine
    if winner.schedule:
        handler["schedule"] = winner.schedule
    handler["dtype"] = winner.dtype or FLOAT32
    if winner.dtype not in (None, FLOAT32):
        if min_cosine is not None:
            handler["min_cosine"] = min_cosine
    cfg["handler"] = handler
    return archives.with_schedule(cfg)


def describe_mismatches(described: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """Where TorchServe's describe answer differs from the YAML's settings (empty when it applied them all)."""
    keys = {"batchSize": "batchSize", "maxBatchDelay": "maxBatchDelay", "minWorkers": "minWorkers"}
    out = [f"{k}: YAML {cfg[k]}, served {described.get(v)}" for k, v in keys.items() if described.get(v) != cfg[k]]
    workers = len(described.get("workers", []))
    if workers != cfg["minWorkers"]:
        out.append(f"workers: YAML {cfg['minWorkers']}, running {workers}")
    return out


def fmt_rate(rate: float) -> str:
    return "none" if rate <= 0 or math.isnan(rate) else f"{rate:.1f} req/s"


@dataclass(frozen=True)
class EngineCost:
    """One (engine, dtype) as the suite calibrated it, and what the planner makes of the base load with it: passes a
    delivered batch and the base configuration's estimated req/s (or why it was not calibrated: `refused`)."""

    engine: str
    dtype: str
    cost: CostModel | None
    passes: float = 0.0  # the base strategy's forward passes per delivered batch of the base load
    rows: float = 0.0  # texts per pass, on average
    est_rps: float = 0.0  # the base configuration (strategy, batch size, layout) estimated on it
    refused: str = ""

    @property
    def fixed_tokens(self) -> float:
        """The fixed cost of a pass in tokens' worth (what the planner weighs a pass against the padding it saves)."""
        return self.cost.overhead_us / self.cost.per_token_us if self.cost and self.cost.per_token_us else math.inf


def engine_costs(
    base: Configuration,
    lengths: Sequence[int],
    calibrated: Mapping[Pair, CostModel | str],  # (engine, dtype): its cost model, or its refusal
    max_length: int = SERVED.max_length,
    max_batch_tokens: int = SERVED.max_batch_tokens,
) -> list[EngineCost]:
    """Each calibrated (engine, dtype), in order, with the planner's passes per delivered batch of `base`'s load
    (its strategy and batch size over these lengths) and `base`'s estimate on it; a refusal (a str) as it is."""
    bs = base.batch_size
    batches = [lengths[i : i + bs] for i in range(0, len(lengths), bs)]
    out = []
    for (engine, dtype), cost in calibrated.items():
        if not isinstance(cost, CostModel):
            out.append(EngineCost(engine, dtype, None, refused=cost))
            continue
        passes = [strategy_passes(base.strategy, b, cost, max_length, max_batch_tokens) for b in batches]
        count = sum(len(p) for p in passes)
        config = replace(base, engine=engine, dtype=None if dtype == FLOAT32 else dtype)
        rps, _ = estimate(config, lengths, cost, max_length, max_batch_tokens)
        out.append(EngineCost(engine, dtype, cost, count / len(batches), len(lengths) / count, rps))
    return out


def best_per_engine(measured: Sequence[Summary]) -> dict[tuple[str | None, str], Summary]:
    """The best measured configuration of each (engine, dtype), best first (a reduced dtype below its floor too:
    `faithful` says whether it may win)."""
    out: dict[tuple[str | None, str], Summary] = {}
    for s in _ranked(measured):
        out.setdefault(_engine_dtype(s.config), s)
    return out


def engine_choice(measured: Sequence[Summary], min_cosine: float | None) -> str:
    """Why the winner runs its engine, in a line for the YAML: the best capacity of each engine and dtype measured."""
    ranking = rank(measured, min_cosine)
    if not ranking:
        return ""
    winner = ranking[0].config
    best = [
        f"{engine or 'default'} {dtype} {fmt_rate(_cap(s))}" + ("" if faithful(s, min_cosine) else " (below the floor)")
        for (engine, dtype), s in best_per_engine(measured).items()
    ]
    chosen = f"engine {winner.engine or 'default'}, dtype {winner.dtype or FLOAT32}"
    return f"{chosen}: the best capacity of each engine and dtype measured: {', '.join(best)}"
