"""The run plan: which configurations a run measures, from a named suite (`suites.yaml`), its configuration axes
and matrices (`options.plan_from_args` applies the command's flags)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from bench.inputs import models, traffic
from bench.inputs.configuration import Configuration
from bench.inputs.engines import engine_kinds, engine_names
from bench.inputs.workloads import BENCH_WORKLOADS
from bucketing.config import SCHEDULE_RULES, SCHEDULES, STRATEGIES
from bucketing.engines.precision import CPU_DTYPES

SUITES = Path(__file__).resolve().parents[1] / "suites.yaml"  # bench/suites.yaml
CONFIG_FIELDS = {f.name for f in fields(Configuration)}
# Flags that make a configuration axis over a suite or a matrix: every configuration once per value.
AXES = {"engines": ("engine", engine_names()), "schedules": ("schedule", SCHEDULES), "dtypes": ("dtype", CPU_DTYPES)}


@dataclass(frozen=True)
class RunPlan:
    """What a run does: its kind (`kinds.RUN_KINDS`) with the kind's options, configurations, and whether to add
    exact-length grouping and the offline sweep."""

    name: str
    description: str
    configs: tuple[Configuration, ...]
    bound: bool
    sweep: dict[str, list[Any]] | None
    kind: str = "matrix"
    options: dict[str, Any] = field(default_factory=dict)  # the kind's own settings (tune: its search space)


def expand(
    defaults: dict[str, Any], configs: Sequence[dict[str, Any]], matrix: dict[str, list[Any]]
) -> list[Configuration]:
    """Configurations from a list and/or every combination of a matrix, over defaults; unknown keys refused."""
    out = []
    items = [dict(c) for c in configs]
    if matrix:
        keys = list(matrix)
        items += [dict(zip(keys, combo)) for combo in itertools.product(*(matrix[k] for k in keys))]
    for item in items:
        merged = {**defaults, **item}
        unknown = sorted(set(merged) - CONFIG_FIELDS)
        if unknown:
            raise SystemExit(
                f"unknown configuration key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(CONFIG_FIELDS))}"
            )
        if merged.get("strategy") not in STRATEGIES:
            raise SystemExit(f"strategy: got {merged.get('strategy')!r}; allowed: {' | '.join(STRATEGIES)}")
        for key, allowed in AXES.values():
            if merged.get(key) not in (None, *allowed):
                raise SystemExit(f"{key}: got {merged.get(key)!r}; allowed: {' | '.join(allowed)}")
        workload = str(merged.get("workload", "longtail"))
        if workload not in BENCH_WORKLOADS and not workload.startswith(traffic.PREFIX):
            raise SystemExit(f"workload: got {merged.get('workload')!r}; allowed: {' | '.join(BENCH_WORKLOADS)}")
        if merged.get("mode", "closed") == "open" and not merged.get("rate"):
            raise SystemExit("an open-loop configuration needs a rate (req/s)")
        out.append(Configuration(**merged))
    return out


def suites(path: Path = SUITES) -> dict[str, Any]:
    named: dict[str, Any] = yaml.safe_load(path.read_text())
    return named


def load_suite(name: str, path: Path = SUITES) -> RunPlan:
    named = suites(path)
    if name not in named:
        raise SystemExit(f"--suite: no suite {name!r} in {path.name}; suites: {', '.join(named)}")
    s = named[name]
    configs = expand(s.get("defaults", {}), s.get("configs", []), s.get("matrix", {}))
    description, bound, sweep = s.get("description", ""), bool(s.get("bound", False)), s.get("sweep")
    return RunPlan(name, description, tuple(configs), bound, sweep, s.get("kind", "matrix"), s.get("options", {}))


def csv_list(text: str | None, cast: type) -> list[Any] | None:
    return [cast(x) for x in text.split(",") if x.strip()] if text else None


def served(config: Configuration) -> Configuration:
    """A configuration with its workload's model and engine where it names none (`models.SERVED_AS`: the rerank
    workload's cross-encoder, the sparse workload's SPLADE on torch)."""
    spec = models.served_as(config.workload)
    return replace(config, model=config.model or spec.model, engine=config.engine or spec.engine)


def engine_runs_dtype(config: Configuration) -> bool:
    """Whether the configuration's engine (where it names one) runs its dtype (where it names one), as the engines
    registry says: an axis crossing engines with dtypes leaves out the pairs no engine runs (onnxruntime bfloat16)."""
    return config.engine is None or config.dtype is None or config.dtype in engine_kinds()[config.engine].dtypes


def one_worker_if_continuous(config: Configuration) -> Configuration:
    """`continuous` runs one worker a model (TorchServe 0.12's queue lock): the same cores as its threads."""
    if config.schedule is None or not SCHEDULE_RULES[config.schedule].pools or config.workers == 1:
        return config
    return replace(config, workers=1, threads=config.workers * config.threads)
