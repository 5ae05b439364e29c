"""What one delivered batch cost and saved, and its emission as TorchServe custom metrics.

Counters (`COUNTERS`) are summed by TorchServe's Prometheus endpoint. Histograms (`HISTOGRAMS`) are emitted as
Prometheus' own series: cumulative `<name>_bucket{le=...}` counters plus `<name>_sum` and `<name>_count`, so
`histogram_quantile` works on them. They are counters rather than TorchServe histograms because TorchServe
0.12's Prometheus histograms use the client's default buckets (0.005 to 10), which fit none of these figures.
Failures are counted by error type in `bucket_errors_total{type, status}`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

# Metric name -> (BatchStats field, unit). All are counters, summed by TorchServe's Prometheus endpoint.
METRICS = {
    "bucket_batches_total": ("batches", "count"),
    "bucket_requests_total": ("requests", "count"),
    "bucket_rejected_total": ("rejected", "count"),
    "bucket_failed_total": ("failed", "count"),
    "bucket_texts_total": ("texts", "count"),
    "bucket_real_tokens_total": ("real_tokens", "count"),
    "bucket_padded_tokens_total": ("padded_tokens", "count"),
    "bucket_sub_batches_total": ("sub_batches", "count"),
    "bucket_forward_ms_total": ("forward_ms", "ms"),
    "bucket_answer_ms_total": ("answer_ms", "ms"),  # rendering and encoding the answers (JSON, base64, packed)
    "bucket_answer_bytes_total": ("answer_bytes", "count"),  # the bodies of the 200 answers, in bytes
}
ERRORS = "bucket_errors_total"  # requests answered with an error, by `type` and `status`
# A gauge, with every batch of a worker whose dtype is not float32: its cosine min to float32, measured at load.
FIDELITY = "bucket_fidelity_cosine_min"
# Shadow checking (`handler.fidelity_sample`): a histogram of sampled served texts' cosines to float32 (buckets at
# these bounds and at `handler.min_cosine`), and a gauge of the worker's minimum so far.
SAMPLES = "bucket_fidelity_sample_cosine"
SAMPLE_BOUNDS = (0.0, 0.9, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99995, 0.99999)
SAMPLES_MIN = "bucket_fidelity_sample_cosine_min"
# A gauge, with every batch of a worker whose `handler.capacity_tokens_per_s` is set (and from every host's /metrics):
# the tokens per second this model holds on this machine at its p99 target, what an autoscaler's target is set from.
CAPACITY = "bucket_capacity_tokens_per_second"

# The queue signals an autoscaler reads (docs/operations/autoscaling.md), by model (`ModelName`): kept by a host's
# own batcher in a `QueueSignals` (the standalone host's; any host with its own queue), read from the frontend by
# `python -m tsctl.exporter` on TorchServe (requests waiting; tokens and in-flight estimated there).
QUEUE_REQUESTS = "bucket_queue_requests"  # gauge: requests admitted and not yet started
QUEUE_TOKENS = "bucket_queue_tokens"  # gauge: their tokens (the host's estimate: body bytes / 4)
INFLIGHT = "bucket_inflight_requests"  # gauge: requests taken into a batch and not yet answered
QUEUE_SECONDS = "bucket_queue_seconds"  # histogram: seconds from a request's arrival to the start of its batch
QUEUE_SECONDS_BOUNDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
QUEUE_GAUGES = (QUEUE_REQUESTS, QUEUE_TOKENS, INFLIGHT)

# Histogram name -> (unit, bucket upper bounds; +Inf is added), and what it observes.
HISTOGRAMS = {
    "bucket_batch_size": ("requests", (1, 2, 4, 8, 16, 32, 64, 128)),  # requests per delivered batch
    "bucket_pass_texts": ("texts", (1, 2, 4, 8, 16, 32, 64, 128, 256)),  # texts per forward pass
    "bucket_pass_padded_tokens": ("tokens", (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)),
    "bucket_request_ms": ("ms", (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)),  # handler time
}


@dataclass(frozen=True)
class BatchStats:
    """What delivered batches cost: requests answered 4xx (`rejected`) and 5xx (`failed`), and the passes run.

    `passes` holds (texts, padded tokens) of each forward pass and `errors` the type and status of each error
    answer; `handler_ms` is the batch's time in the handler (what each of its requests waited there), `answer_ms`
    the part of it spent rendering and encoding answers, `answer_bytes` the 200 answers' bodies."""

    batches: int = 1
    requests: int = 0
    rejected: int = 0
    failed: int = 0
    texts: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    sub_batches: int = 0
    forward_ms: float = 0.0
    answer_ms: float = 0.0
    answer_bytes: int = 0
    passes: tuple[tuple[int, int], ...] = ()
    errors: tuple[tuple[str, int], ...] = ()
    handler_ms: float = 0.0

    @property
    def padding_efficiency(self) -> float | None:
        """Real / padded tokens (None before any token was run)."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else None

    @property
    def mean_batch_size(self) -> float | None:
        """Requests per delivered batch."""
        return self.requests / self.batches if self.batches else None

    @property
    def answer_us_per_text(self) -> float | None:
        """Microseconds spent rendering and encoding answers, per text answered."""
        return self.answer_ms * 1000.0 / self.texts if self.texts else None

    @property
    def answer_bytes_per_text(self) -> float | None:
        """Bytes of the 200 answers' bodies, per text."""
        return self.answer_bytes / self.texts if self.texts else None

    @property
    def sub_batches_per_batch(self) -> float | None:
        return self.sub_batches / self.batches if self.batches else None

    def __add__(self, other: BatchStats) -> BatchStats:
        return BatchStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def observations(self) -> dict[str, list[tuple[float, int]]]:
        """(value, weight) pairs per histogram for one delivered batch."""
        return {
            "bucket_batch_size": [(self.requests, 1)],
            "bucket_pass_texts": [(rows, 1) for rows, _ in self.passes],
            "bucket_pass_padded_tokens": [(padded, 1) for _, padded in self.passes],
            "bucket_request_ms": [(self.handler_ms, self.requests)],
        }


@dataclass(frozen=True)
class Samples:
    """One handler call's shadow checks: the sampled texts' cosines to float32, the worker's minimum so far (None
    before its first), and `handler.min_cosine` (a bucket bound of their histogram)."""

    cosines: tuple[float, ...]
    minimum: float | None
    floor: float

    @property
    def bounds(self) -> tuple[float, ...]:
        """The histogram's bucket bounds: `SAMPLE_BOUNDS` and the floor."""
        return tuple(sorted({*SAMPLE_BOUNDS, self.floor}))


def cumulative(observations: Sequence[tuple[float, int]], bounds: Sequence[float]) -> list[tuple[str, int]]:
    """Prometheus buckets: for each upper bound (then +Inf), the weight of observations at or below it."""
    out = [(f"{b:.10g}", sum(w for v, w in observations if v <= b)) for b in bounds]
    return [*out, ("+Inf", sum(w for _, w in observations))]


def emit(
    metrics: Any,
    stats: BatchStats,
    cosine_min: float | None = None,
    samples: Samples | None = None,
    capacity: float | None = None,
) -> None:
    """Add one batch's figures to TorchServe's metric cache (`context.metrics`), if there is one; `cosine_min`:
    the worker's measured fidelity to float32 (a reduced dtype), as the `FIDELITY` gauge; `samples`: its shadow
    checks (`handler.fidelity_sample`), as the `SAMPLES` histogram and `SAMPLES_MIN` gauge; `capacity`: the
    configured `handler.capacity_tokens_per_s`, as the `CAPACITY` gauge."""
    if metrics is None:
        return
    from ts.metrics.dimension import Dimension
    from ts.metrics.metric_type_enum import MetricTypes

    def add(name: str, value: float, unit: str, dims: Sequence[tuple[str, str]] = ()) -> None:
        # A fresh dimensions list each call: TorchServe appends its default dimensions to the one it gets.
        metrics.add_metric(name, value, unit, None, [Dimension(k, v) for k, v in dims], MetricTypes.COUNTER)

    for name, (attr, unit) in METRICS.items():
        add(name, getattr(stats, attr), unit)
    histograms: dict[str, tuple[str, Sequence[float], list[tuple[float, int]]]] = {
        name: (*HISTOGRAMS[name], observed) for name, observed in stats.observations().items()
    }
    if samples is not None:
        histograms[SAMPLES] = ("cosine", samples.bounds, [(c, 1) for c in samples.cosines])
    for name, (unit, bounds, observed) in histograms.items():
        for le, count in cumulative(observed, bounds):
            add(f"{name}_bucket", count, unit, [("le", le)])
        add(f"{name}_sum", sum(v * w for v, w in observed), unit)
        add(f"{name}_count", sum(w for _, w in observed), "count")
    for (kind, status), count in Counter(stats.errors).items():
        add(ERRORS, count, "count", [("type", kind), ("status", str(status))])
    if cosine_min is not None:
        metrics.add_metric(FIDELITY, cosine_min, "cosine", None, [], MetricTypes.GAUGE)
    if samples is not None and samples.minimum is not None:
        metrics.add_metric(SAMPLES_MIN, samples.minimum, "cosine", None, [], MetricTypes.GAUGE)
    if capacity:
        metrics.add_metric(CAPACITY, capacity, "tokens/s", None, [], MetricTypes.GAUGE)


def histogram_parts(name: str) -> set[str]:
    """A histogram's series as Prometheus shows them."""
    return {f"{name}_{part}" for part in ("bucket", "sum", "count")}


def series_names() -> set[str]:
    """Every metric name the handler emits, as Prometheus shows it."""
    names = set(METRICS) | {ERRORS, FIDELITY, SAMPLES_MIN, CAPACITY}
    return names.union(*(histogram_parts(h) for h in (*HISTOGRAMS, SAMPLES)))


def signal_names() -> set[str]:
    """The queue signals' series (`QueueSignals.samples`), as Prometheus shows them."""
    return {*QUEUE_GAUGES, CAPACITY} | histogram_parts(QUEUE_SECONDS)


def host_series_names() -> set[str]:
    """Every `bucket_*` series some host serves: the handler's and the queue signals."""
    return series_names() | signal_names()


Labels = tuple[tuple[str, str], ...]
# One series' value now: (name, Prometheus type, labels, value).
Sample = tuple[str, str, Labels, float]


class QueueSignals:
    """One model's queue as an autoscaler reads it, kept by its host's batcher: call `admitted` when a request is
    queued, `left` when one leaves the queue unrun (its caller gave up), `started` when one is taken into a batch
    (with the seconds it waited) and `finished` when it is answered; `samples` is what the host's /metrics shows.
    Thread-safe (a lock per call), so a batcher may call it from any thread."""

    def __init__(self, capacity_tokens_per_s: float = 0.0) -> None:
        self.capacity = capacity_tokens_per_s
        self.requests = 0
        self.tokens = 0
        self.inflight = 0
        self._waits = [0] * (len(QUEUE_SECONDS_BOUNDS) + 1)  # per bucket (the last: above every bound)
        self._wait_sum = 0.0
        self._lock = threading.Lock()

    def admitted(self, tokens: int) -> None:
        with self._lock:
            self.requests += 1
            self.tokens += tokens

    def left(self, tokens: int) -> None:
        with self._lock:
            self.requests -= 1
            self.tokens -= tokens

    def started(self, tokens: int, waited_s: float) -> None:
        with self._lock:
            self.requests -= 1
            self.tokens -= tokens
            self.inflight += 1
            index = next((i for i, b in enumerate(QUEUE_SECONDS_BOUNDS) if waited_s <= b), len(QUEUE_SECONDS_BOUNDS))
            self._waits[index] += 1
            self._wait_sum += waited_s

    def finished(self, count: int = 1) -> None:
        with self._lock:
            self.inflight -= count

    def samples(self, labels: Labels = ()) -> list[Sample]:
        """The gauges now (capacity when configured) and the `QUEUE_SECONDS` histogram's cumulative series."""
        with self._lock:
            out: list[Sample] = [
                (QUEUE_REQUESTS, "gauge", labels, float(self.requests)),
                (QUEUE_TOKENS, "gauge", labels, float(self.tokens)),
                (INFLIGHT, "gauge", labels, float(self.inflight)),
            ]
            if self.capacity:
                out.append((CAPACITY, "gauge", labels, float(self.capacity)))
            running = 0
            for bound, count in zip((*QUEUE_SECONDS_BOUNDS, None), self._waits):
                running += count
                le = "+Inf" if bound is None else f"{bound:.10g}"
                out.append((f"{QUEUE_SECONDS}_bucket", "counter", (*labels, ("le", le)), float(running)))
            out.append((f"{QUEUE_SECONDS}_sum", "counter", labels, self._wait_sum))
            out.append((f"{QUEUE_SECONDS}_count", "counter", labels, float(running)))
        return out
