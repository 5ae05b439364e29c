"""Pure summaries: percentiles, handler-metric deltas, one configuration's figures, and comparisons."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bench.harness.capacity import Capacity
from bench.inputs.configuration import TORCHSERVE, Configuration
from bucketing.config import STRATEGY_RULES
from bucketing.engine_registry import is_reduced
from bucketing.metrics import METRICS, BatchStats

# The handler's counters, as TorchServe exposes them: metric name -> BatchStats field.
HANDLER_METRICS = {name: attr for name, (attr, _unit) in METRICS.items()}


HandlerDelta = BatchStats  # what the handler's counters moved by during one measurement


def parse_prometheus(text: str, model: str) -> dict[str, float]:
    """The handler counters of one model from Prometheus text: TorchServe's (`ModelName` then its other labels) or
    the standalone server's (`ModelName` alone)."""
    out = {}
    for name in HANDLER_METRICS:
        m = re.search(rf'^{name}{{ModelName="{re.escape(model)}"(?:,[^}}]*)?}} ([0-9.eE+-]+)$', text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def handler_delta(before: Mapping[str, float], after: Mapping[str, float]) -> HandlerDelta:
    deltas: dict[str, Any] = {
        attr: after.get(name, 0.0) - before.get(name, 0.0) for name, attr in HANDLER_METRICS.items()
    }
    return BatchStats(**deltas)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    """One configuration's measured figures (one row of results.csv)."""

    config: Configuration
    requests: int
    ok: int
    wall_s: float
    rps: float
    tokens_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    errors: dict[str, int] = field(default_factory=dict)
    handler: HandlerDelta = field(default_factory=lambda: BatchStats(batches=0))
    server_cpu_cores: float | None = None
    client_cpu_cores: float = 0.0
    bound_tokens_per_s: float | None = None
    engine: str = ""  # the engine the workers ran (torch | onnxruntime)
    device: str = ""  # where they ran: cpu, or gpu (TorchServe's describe API says per worker)
    capacity: Capacity | None = None  # highest open-loop rate within the p99 target (--p99-ms)
    min_cosine: float | None = None  # its answers against our float32 batch-of-one reference (spot check)
    short_p50_ms: float = float("nan")  # p50 of the shortest quarter of requests (by tokens)
    roofline_tokens_per_s: float | None = None  # the fp32 GEMM roofline of this model and layout (`roofline`)
    worker_peak_rss_mb: float | None = None  # the largest peak RSS of its workers, after its load (None: not read)

    @property
    def roofline_fraction(self) -> float | None:
        return self.tokens_per_s / self.roofline_tokens_per_s if self.roofline_tokens_per_s else None

    @property
    def bound_fraction(self) -> float | None:
        return self.tokens_per_s / self.bound_tokens_per_s if self.bound_tokens_per_s else None

    def row(self) -> dict[str, object]:
        c = self.config
        h = self.handler
        return {
            "config": c.name,
            "server": c.served_by,
            "host": "" if c.peer else c.host,  # what served our worker (a peer is its own server)
            "strategy": c.peer or c.strategy,
            "batch_size": c.batch_size,
            "max_batch_delay": c.max_batch_delay,
            "workers": c.workers,
            "threads": c.threads,
            "engine": self.engine,
            "schedule": "" if c.peer else c.schedule or "batch",
            "dtype": c.dtype or "float32",  # a peer's too: its rows are compared with ours of the same dtype
            "device": self.device,
            "workload": c.workload_label,
            "mode": c.mode,
            "concurrency": c.concurrency if c.mode == "closed" else "",
            "rate": c.rate if c.rate is not None else "",
            "requests": self.requests,
            "rps": round(self.rps, 2),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "p50_ms": round(self.p50_ms, 1),
            "p90_ms": round(self.p90_ms, 1),
            "p99_ms": round(self.p99_ms, 1),
            "max_ms": round(self.max_ms, 1),
            "errors": sum(self.errors.values()),
            "errors_by_status": " ".join(f"{k}:{v}" for k, v in sorted(self.errors.items())),
            "padding_efficiency": _round(h.padding_efficiency, 3),
            "mean_batch_size": _round(h.mean_batch_size, 2),
            "sub_batches_per_batch": _round(h.sub_batches_per_batch, 2),
            "answer_us_per_text": _round(h.answer_us_per_text, 1),
            "answer_bytes_per_text": _round(h.answer_bytes_per_text, 0),
            "real_tokens": int(h.real_tokens),
            "padded_tokens": int(h.padded_tokens),
            "server_cpu_cores": _round(self.server_cpu_cores, 2),
            "client_cpu_cores": round(self.client_cpu_cores, 2),
            "bound_fraction": _round(self.bound_fraction, 3),
            "p99_target_ms": self.capacity.target_ms if self.capacity else "",
            "capacity_rps": round(self.capacity.rate, 1) if self.capacity else "",
            "capacity_p99_ms": round(self.capacity.best.p99_ms, 1) if self.capacity and self.capacity.best else "",
            "capacity_steps": len(self.capacity.steps) if self.capacity else "",
            "min_cosine": _round(self.min_cosine, 6),
            "short_p50_ms": round(self.short_p50_ms, 1),
            "roofline_fraction": _round(self.roofline_fraction, 3),
            "worker_peak_rss_mb": _round(self.worker_peak_rss_mb, 0),
        }

    def as_json(self) -> dict[str, object]:
        out = {**self.row(), "config_detail": asdict(self.config), "handler": asdict(self.handler)}
        if self.capacity:
            out["capacity_detail"] = [asdict(step) for step in self.capacity.steps]
        return out


def _round(value: float | None, digits: int) -> float | str:
    return "" if value is None else round(value, digits)


CSV_COLUMNS = tuple(Summary(Configuration("x", 1), 0, 0, 1, 0, 0, 0, 0, 0, 0).row())


def summarize(
    config: Configuration,
    samples: Sequence[tuple[float, int, int]],
    wall_s: float,
    handler: HandlerDelta,
    client_cpu_s: float,
    server_cpu_s: float | None = None,
    bound_tokens_per_s: float | None = None,
    engine: str = "",
    device: str = "",
) -> Summary:
    """Figures from (latency_ms, status, tokens) per request; latency percentiles over successful requests."""
    ok = [(lat, tok) for lat, status, tok in samples if status == 200]
    latencies = [lat for lat, _ in ok]
    errors = Counter(str(status) for _, status, _ in samples if status != 200)
    by_tokens = sorted(ok, key=lambda x: x[1])
    shortest = [lat for lat, _ in by_tokens[: max(1, len(by_tokens) // 4)]] if by_tokens else []
    return Summary(
        config=config,
        requests=len(samples),
        ok=len(ok),
        wall_s=wall_s,
        rps=len(ok) / wall_s if wall_s else 0.0,
        tokens_per_s=sum(tok for _, tok in ok) / wall_s if wall_s else 0.0,
        p50_ms=percentile(latencies, 50),
        p90_ms=percentile(latencies, 90),
        p99_ms=percentile(latencies, 99),
        max_ms=max(latencies) if latencies else float("nan"),
        errors=dict(errors),
        handler=handler,
        server_cpu_cores=server_cpu_s / wall_s if server_cpu_s is not None and wall_s else None,
        client_cpu_cores=client_cpu_s / wall_s if wall_s else 0.0,
        bound_tokens_per_s=bound_tokens_per_s,
        engine=engine,
        device=device,
        short_p50_ms=percentile(shortest, 50),
    )


@dataclass(frozen=True)
class Comparison:
    """`a` against `b`: throughput and p99 ratios."""

    a: Summary
    b: Summary

    @property
    def throughput_ratio(self) -> float:
        return self.a.rps / self.b.rps if self.b.rps else float("inf")

    @property
    def p99_ratio(self) -> float:
        return self.a.p99_ms / self.b.p99_ms if self.b.p99_ms else float("nan")

    @property
    def capacity_ratio(self) -> float | None:
        """Capacity at the p99 target, `a` over `b` (None unless both were searched; inf if `b` held none)."""
        if not (self.a.capacity and self.b.capacity):
            return None
        return self.a.capacity.rate / self.b.capacity.rate if self.b.capacity.rate else float("inf")


def budgeted(strategy: str) -> bool:
    """Whether a configuration's strategy is the handler's budgeted one (a peer's names the peer instead)."""
    rule = STRATEGY_RULES.get(strategy)
    return rule is not None and rule.budgeted


def comparisons(summaries: Sequence[Summary]) -> list[Comparison]:
    """Each bucketed configuration against the others of its workload, mode and rate that differ in one way.

    Pairs: same batch size with another strategy, batch size 1 (direct inference) of any strategy, and the same
    configuration on another engine, or in bfloat16 against float32, each within one host. A peer is compared only
    with our configurations of its own dtype (equal precision), on any host.
    """
    out = []
    for a in summaries:
        if not budgeted(a.config.strategy) or a.config.batch_size == 1:
            continue
        for b in summaries:
            same_load = (b.config.workload_label, b.config.mode, b.config.rate, b.config.model) == (
                a.config.workload_label,
                a.config.mode,
                a.config.rate,
                a.config.model,
            )
            if b is a or not same_load or b.config.max_batch_delay != a.config.max_batch_delay:
                continue
            if b.config.peer is not None and (b.config.dtype or "float32") != (a.config.dtype or "float32"):
                continue  # a peer against ours at its own precision only
            if b.config.peer is None and b.config.host != a.config.host:
                continue  # ours within a host; across hosts: `host_comparisons`
            same_engine = (b.config.engine, b.config.dtype) == (
                a.config.engine,
                a.config.dtype,
            ) or b.config.peer is not None
            other_strategy = (
                b.config.batch_size == a.config.batch_size and not budgeted(b.config.strategy) and same_engine
            )
            # the same configuration on another engine, once per pair (onnxruntime against torch)
            other_engine = (a.config.engine or "") < (b.config.engine or "") and replace(
                b.config, engine=a.config.engine
            ) == a.config
            # the same configuration in bfloat16 against float32 (each on its engine: torch for bfloat16)
            other_dtype = (
                is_reduced(a.config.dtype)
                and not is_reduced(b.config.dtype)
                and replace(b.config, dtype=a.config.dtype, engine=a.config.engine) == a.config
            )
            if other_strategy or b.config.batch_size == 1 or other_engine or other_dtype:
                out.append(Comparison(a, b))
    return out


def baseline_host(summaries: Sequence[Summary]) -> str:
    """The host others are compared with: TorchServe where it ran, else the first host measured."""
    hosts = [s.config.host for s in summaries if s.config.peer is None]
    return TORCHSERVE if TORCHSERVE in hosts or not hosts else hosts[0]


def host_comparisons(summaries: Sequence[Summary]) -> list[Comparison]:
    """Each configuration on another host against the same configuration on the baseline host (`a`: the other
    host, `b`: the baseline), in the order measured; none where one host ran."""
    base = baseline_host(summaries)
    by_config = {s.config: s for s in summaries if s.config.peer is None and s.config.host == base}
    out = []
    for a in summaries:
        if a.config.peer is None and a.config.host != base:
            b = by_config.get(replace(a.config, host=base))
            if b is not None:
                out.append(Comparison(a, b))
    return out
